"""Credentials in URLs masked in text and in the errors that name them (:mod:`lerobot_dali.url_secrets`); the retries'
use over real HTTP is tested in ``test_http_remote``."""

from __future__ import annotations

from typing import Any

import pytest

from lerobot_dali.remote_errors import is_transient, status_of
from lerobot_dali.url_secrets import mask_error, masked

aiohttp = pytest.importorskip("aiohttp", reason="the errors masked are aiohttp's (the 'test' extra)")

SIGNED = "https://alice:pw@host/ds/f.mp4?versionId=3&X-Amz-Signature=ab%2Fc&Sig=s&token=&scope=all#frag"
SHOWN = "https://alice:***@host/ds/f.mp4?versionId=3&X-Amz-Signature=***&Sig=***&token=&scope=all#frag"


def test_masked_hides_the_values_of_credential_params_and_passwords_only() -> None:
    assert masked(f"url={SIGNED!r}; then {SIGNED} ") == f"url={SHOWN!r}; then {SHOWN} "
    plain = "https://host:8080/ds?versionId=3&page=2 and /a?b=c"
    assert masked(plain) == plain


def test_mask_error_masks_aiohttps_errors_and_their_causes_in_place_keeping_their_status() -> None:
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    url = URL(SIGNED.replace("alice:pw@", ""), encoded=True)
    timeout = aiohttp.ConnectionTimeoutError(f"Connection timeout to host {url}")
    info = aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict()), url)
    error = aiohttp.ClientResponseError(info, (), status=503, message="Service Unavailable")
    error.__cause__, error.__context__, timeout.__context__ = timeout, timeout, error  # (a cycle: walked once)
    error.add_note(f"reading {url} failed")
    assert mask_error(error) is error
    said = [str(error), str(timeout), *error.__notes__]
    assert not [text for text in said if "ab%2Fc" in text or "Sig=s&" in text], said
    assert "X-Amz-Signature=***&Sig=***&token=&scope=all" in str(error) and str(timeout).endswith("scope=all#frag")
    assert error.request_info.method == "GET" and status_of(error) == 503 and is_transient(error)
    assert is_transient(timeout) and isinstance(timeout, TimeoutError)


def test_mask_error_masks_the_credential_headers_that_the_errors_repr_names() -> None:
    """A URL's ``user:password`` is sent as an ``Authorization`` header (``dataset_location``), which aiohttp's errors
    keep in their ``request_info``: ``repr`` of a failed read named it (base64 of the password), beside an
    ``X-Api-Key`` of the storage options and a ``Cookie`` (a session's, CloudFront's signed cookies: it was named, 1
    of 1). Masked now; the other request headers, and the response's, kept."""
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    url = URL("https://host/ds/f.mp4")
    sent = {"Authorization": "Basic YWxpY2U6czNjcmV0", "x-api-key": "k3y", "Range": "bytes=0-9", "Cookie": "c00k"}
    info = aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict(sent)), url)
    error = aiohttp.ClientResponseError(info, (), status=429, message="Too Many", headers={"Retry-After": "3"})
    mask_error(error)
    assert not [s for s in ("YWxpY2U6czNjcmV0", "k3y", "c00k") if s in repr(error)], repr(error)
    shown = {"Authorization": "***", "x-api-key": "***", "Range": "bytes=0-9", "Cookie": "***"}
    assert dict(error.request_info.headers) == shown
    assert error.request_info.url == url and error.headers == {"Retry-After": "3"} and status_of(error) == 429


class _NoText:
    def __str__(self) -> str:
        raise RuntimeError("no text")

    def __repr__(self) -> str:
        return "_NoText()"


class _Unreadable(Exception):
    @property
    def request_info(self) -> object:
        raise RuntimeError("not aiohttp's")


def test_the_request_log_filter_masks_every_record_it_is_given_and_never_raises() -> None:
    """fsspec's HTTP records are masked once a filesystem sends a credential in its query (``mask_request_logs``): the
    filter masked a message's string arguments alone, so a mapping of arguments, a message that is an error (not a
    string) and a traceback a handler formatted before named the signature (3 of 3), and it raised where an
    argument's ``str()`` did (its ``%r`` formats) or an error's parts could not be read (2 of 2): a filter's error is
    the logging caller's, fsspec's read. Each record now comes out masked, its other text as it was: a message its
    arguments do not make (``"read %d"`` given the URL; one whose ``str()`` raises) said with them, both masked, and an
    error given that was never raised (no traceback) masked as a raised one is."""
    import io
    import logging
    import re
    import sys

    from lerobot_dali.url_secrets import mask_request_logs

    mask_request_logs({"sig": "x"})
    library, out = logging.getLogger("fsspec.http"), io.StringIO()
    handler, level = logging.StreamHandler(out), library.level
    library.addHandler(handler)
    library.setLevel(logging.DEBUG)
    try:
        url = "https://host/monkey/token/f.mp4?sig=SECRET&page=2"
        library.debug("%(url)s", {"url": url})
        library.debug(ValueError(url))
        library.debug("%r read %d", _NoText(), 3)
        library.debug("read %d", url)  # (arguments the message does not take: both said, masked)
        library.debug(_NoText(), url)
        try:
            raise _Unreadable(url)
        except _Unreadable:
            library.debug("failed", exc_info=True)
        record = logging.LogRecord("fsspec.http", logging.DEBUG, __file__, 1, "head failed", None, None)
        record.exc_text = f"Traceback ...\nClientResponseError: 503, url='{url}'"
        library.handle(record)
        try:
            raise OSError(url)
        except OSError:
            library.debug("", exc_info=sys.exc_info())
        library.debug("not raised", exc_info=KeyError(url))  # (an error never raised: no traceback)
    finally:
        library.removeHandler(handler)
        library.setLevel(level)
    said = out.getvalue()
    assert "SECRET" not in said, said
    shown = url.replace("SECRET", "***")
    lines = said.splitlines()
    assert lines[:4] + lines[5:6] == [
        shown,
        shown,
        "_NoText() read 3",
        f"read %d (arguments the message does not take: ('{shown}',))",
        "failed (its exception not shown: it could not be masked)",
    ]
    unsaid = re.escape(f" (arguments the message does not take: ('{shown}',))")
    assert re.fullmatch(rf"<\S+\._NoText object at 0x[0-9a-f]+>{unsaid}", lines[4]), lines[4]
    assert f"url='{shown}'" in said and f"OSError: {shown}" in said and f"KeyError: '{shown}'" in said


def test_mask_error_masks_the_redirects_that_the_errors_repr_names() -> None:
    """A request redirected before it failed keeps the redirects' responses in its error's ``history``, whose ``repr``
    names each: the URL asked, the signed URL's query in it, and its headers, ``Location`` with the next URL (a CDN's
    own signature). ``repr`` of the error named both after mask_error (2 of 2); now neither, their status kept."""
    from aiohttp import web

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/cdn/f.mp4?X-Amz-Signature=CDNSECRET")

    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=503)

    error = _failed_after_a_redirect(moved, busy, params={"sig": "USERSECRET"})
    assert "USERSECRET" in repr(error.history) and "CDNSECRET" in repr(error.history)  # (what is masked)
    mask_error(error)
    assert not [s for s in ("USERSECRET", "CDNSECRET") if s in repr(error)], repr(error)
    assert "f.mp4?sig=***" in repr(error.history) and "Signature=***" in repr(error.history)
    assert [r.status for r in error.history] == [302] and error.status == 503 and status_of(error) == 503


def test_without_credentials_keeps_the_parameters_it_keeps_as_written_and_drops_credential_names_only() -> None:
    """A description dropped every parameter whose name merely held key, pass, auth, sig, token or session (``monkey``,
    ``passage``, ``author``, ``tokenizer``, ``design``, ``keys_count``, ``pass_rate``: 7 of 7 dropped) and re-encoded
    those it kept (``e=f=g`` as ``e=f%3Dg``, ``x=%2f`` as ``x=%2F``). Names are matched by word now (``api_key``,
    ``AWSAccessKeyId``, ``%74oken``), the others kept byte for byte; a signed URL's other fields (Azure SAS's ``sv``,
    ``se``, ``sp``...) go with its ``sig``, and stay where there is none."""
    from lerobot_dali.url_secrets import is_secret_param, without_credentials

    kept = "a=%2F&monkey=1&passage=2&author=x&tokenizer=t5&design=x/y&e=f=g&b=c+d&keys_count=3&pass_rate=0.5"
    secret = "token=T&api_key=K&AWSAccessKeyId=A&%74oken=P&X-Amz-Security-Token=S&sessionToken=U&pass=W"
    assert without_credentials(f"s3://b/ds?{secret}&{kept}") == f"s3://b/ds?{kept}"
    assert without_credentials(f"memory://b/ds?{kept}") == f"memory://b/ds?{kept}"
    assert [n for n in ("monkey", "passage", "author", "tokenizer", "design", "keyword") if is_secret_param(n)] == []
    sas = "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2026-01-01T00:00:00Z&st=2025-01-01&spr=https&skoid=o&sig=ab%2Fc%3D"
    assert without_credentials(f"https://acct.blob.core.windows.net/c/ds?{sas}&versionid=3") == (
        "https://acct.blob.core.windows.net/c/ds?versionid=3"
    )
    assert without_credentials("s3://b/ds?sp=1&se=2&st=3") == "s3://b/ds?sp=1&se=2&st=3"  # (no signature: no SAS)
    assert without_credentials("https://u:p@h/ds?x=%2f#frag") == "https://h/ds?x=%2f#frag"


def test_masked_masks_a_value_alone_in_a_path_that_keeps_the_query() -> None:
    """A filesystem that keeps a URL's query in its paths (``memory://``, any whose ``_strip_protocol`` keeps '?')
    appends a file's path to it: "/b/ds?a=1&token=SECRET/meta/info.json" was masked as ".../ds?a=1&token=***", the
    file's path lost with it. Only the value is masked there now; in an http(s) URL's query, where '/' is part of a
    value, the value is masked to the next '&' as before."""
    assert masked("File /b/ds?a=1&token=SECRET/meta/info.json does not exist") == (
        "File /b/ds?a=1&token=***/meta/info.json does not exist"
    )
    assert masked("memory://b/ds?sig=SECRET&v=2/f.bin") == "memory://b/ds?sig=***&v=2/f.bin"
    assert masked("url='https://h/ds?sig=ab/cd&x=1/2'") == "url='https://h/ds?sig=***&x=1/2'"
    assert masked("https://h/ds?monkey=1&passage=a/b") == "https://h/ds?monkey=1&passage=a/b"


def test_mask_error_masks_the_credential_headers_of_the_response_and_its_redirects() -> None:
    """aiohttp's ``ClientResponseError`` keeps the response's headers, which its ``repr`` names: a ``Set-Cookie`` (a
    session's), an ``X-Amz-Security-Token`` or ``Authorization`` echoed, and those of the redirects in its ``history``
    (3 of 3 named after mask_error). Masked now; ``Retry-After`` (which the retries read) and the status kept."""
    from aiohttp import web

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/cdn/f.mp4", headers={"Set-Cookie": "CloudFront-Signature=REDIRECTCOOKIE; Path=/"})

    async def busy(request: web.Request) -> web.Response:
        headers = {"Set-Cookie": "session=FINALCOOKIE", "X-Amz-Security-Token": "ECHOED", "Retry-After": "3"}
        return web.Response(status=503, headers={**headers, "Authorization": "Bearer ECHOTOKEN"})

    error = _failed_after_a_redirect(moved, busy)
    secrets = ("REDIRECTCOOKIE", "FINALCOOKIE", "ECHOED", "ECHOTOKEN")
    assert [s for s in secrets if s in repr(error)] == list(secrets)  # (what is masked)
    mask_error(error)
    assert [s for s in secrets if s in repr(error) or s in str(error)] == [], repr(error)
    assert error.headers["Retry-After"] == "3" and error.headers["Set-Cookie"] == "***" and error.status == 503
    assert "'Set-Cookie': '***'" in repr(error.history) and [r.status for r in error.history] == [302]


def _failed_after_a_redirect(moved: Any, busy: Any, params: dict[str, str] | None = None) -> Any:
    """The error of a GET of ``/ds/f.mp4`` (with ``params``) from a local server whose ``moved`` answers it, as
    redirected to ``/cdn/f.mp4``, which ``busy`` answers with an error."""
    import asyncio

    from aiohttp import web

    async def failed() -> aiohttp.ClientResponseError:
        app = web.Application()
        app.router.add_get("/ds/f.mp4", moved)
        app.router.add_get("/cdn/f.mp4", busy)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as session:
                response = await session.get(f"http://127.0.0.1:{port}/ds/f.mp4", params=params)
                with pytest.raises(aiohttp.ClientResponseError) as caught:
                    response.raise_for_status()
                return caught.value
        finally:
            await runner.cleanup()

    return asyncio.run(failed())


def test_mask_error_masks_the_urls_its_other_headers_name_and_a_password_holding_an_at() -> None:
    """aiohttp's error for a redirect (a 302 it was not to follow) names its response's ``Location`` and ``Link`` in its
    ``repr``: a signed URL's signature and credential were shown (3 of 3), as was a password's tail after an '@' it
    holds. Masked now; the headers that name none (``Retry-After``) and the rest of each URL kept."""
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    sent = URL("https://h/ds/f.mp4?sig=S3CRsent", encoded=True)
    asked = CIMultiDictProxy(CIMultiDict({"Referer": "https://h/?token=S3CRref"}))
    answered = {
        "Location": "https://cdn/x.mp4?X-Amz-Signature=S3CRloc&X-Amz-Credential=S3CRcred&versionId=3",
        "Link": "<https://cdn/y?token=S3CRlink>; rel=next",
        "Retry-After": "2",
    }
    info = aiohttp.RequestInfo(sent, "GET", asked, sent)
    told = CIMultiDictProxy(CIMultiDict(answered))
    error = mask_error(aiohttp.ClientResponseError(info, (), status=302, message="Found", headers=told))
    shown = f"{error!r} {error}"
    assert "S3CR" not in shown
    assert error.headers["Location"] == "https://cdn/x.mp4?X-Amz-Signature=***&X-Amz-Credential=***&versionId=3"
    assert error.headers["Retry-After"] == "2" and error.headers["Link"] == "<https://cdn/y?token=***>; rel=next"
    assert masked("see https://alice:p@ss@host/ds?a=1") == "see https://alice:***@host/ds?a=1"


def test_is_secret_param_knows_signed_cdn_urls_and_function_keys_and_keeps_names_that_share_their_letters() -> None:
    """Tencent's and Qiniu's signed CDN URLs (``sign``), an HMAC, a bearer token, Azure Functions' key (``code``), a
    one-time password and a CAS ticket were kept in descriptions and shown in messages (6 of 6). Names that only share
    their letters stay shown."""
    from lerobot_dali.url_secrets import is_secret_param, without_credentials

    secret = ["sign", "hmac", "bearer", "code", "otp", "ticket", "x-oss-signature", "OSSAccessKeyId", "Sign-Key"]
    plain = ["design", "signed", "signal", "codec", "code_version", "keyframes", "keyframe_interval", "ticket_count"]
    assert [name for name in secret if not is_secret_param(name)] == []
    assert [name for name in plain if is_secret_param(name)] == []
    assert without_credentials("s3://b/ds?codec=h264&sign=S3CR&t=5f&code=S3CR") == "s3://b/ds?codec=h264&t=5f"
    assert masked("https://cdn/ds/f.mp4?sign=S3CR&t=5f") == "https://cdn/ds/f.mp4?sign=***&t=5f"


#: Query parameters of S3, GCS, Azure, Hugging Face and plain http(s) URLs that are no credential.
_ORDINARY = (
    "versionId", "version-id-marker", "prefix", "delimiter", "marker", "max-keys", "list-type", "continuation-token",
    "start-after", "fetch-owner", "encoding-type", "key-marker", "upload-id-marker", "uploadId", "partNumber",
    "response-content-type", "response-content-disposition", "response-cache-control", "response-expires", "x-id",
    "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Algorithm", "X-Amz-Content-Sha256",
    "x-amz-checksum-mode", "X-Goog-Date", "X-Goog-Expires", "X-Goog-SignedHeaders", "X-Goog-Algorithm",
    "Expires", "Key-Pair-Id", "alt", "generation", "ifGenerationMatch", "userProject", "pageToken",
    "maxResults", "projection", "fields", "uploadType", "restype", "comp", "maxresults", "include", "snapshot",
    "versionid", "timeout", "sv", "se", "sp", "sr", "st", "spr", "skoid", "sktid", "revision", "expand", "recursive",
    "cursor", "limit", "offset", "page", "per_page", "download", "format", "q", "sort", "SignatureVersion",
    "SignatureMethod", "x-oss-signature-version", "token_type", "key_id", "sign_in", "sort_key", "nextPageToken",
)  # fmt: skip
#: Query parameters (and a few headers) that carry a credential.
_SECRETS = (
    "X-Amz-Signature", "X-Amz-Security-Token", "X-Amz-Credential", "X-Goog-Signature", "X-Goog-Credential",
    "Signature", "sig", "token", "access_token", "key", "api_key", "apikey", "apiKey", "password", "passwd", "pass",
    "pwd", "AWSAccessKeyId", "OSSAccessKeyId", "x-oss-signature", "sessionToken", "security_token", "client_secret",
    "hf_token", "auth", "auth_token", "oauth_token", "oauth_signature", "id_token", "refresh_token", "jwt", "sign",
    "code", "secret", "private_token", "X-Auth-Token", "session", "sessionid", "session_key", "Authorization", "Cookie",
    "Set-Cookie", "auth_code", "api_key_v2", "GoogleAccessId",
)  # fmt: skip


def test_is_secret_param_masks_credentials_and_shows_the_other_parameters_of_storage_urls() -> None:
    """Every name holding a credential's word was one, and every ``X-Amz-``/``X-Goog-`` name: 22 of 77 ordinary
    parameters were masked (a presigned URL's ``X-Amz-Date`` and ``X-Amz-Expires``, which say why a signature was
    refused, ``continuation-token``, ``key-marker``, ``signature_version``, ``token_type``, CloudFront's public
    ``Key-Pair-Id``...). A credential's word followed by one that tells of it (``_version``, ``_type``, ``-marker``,
    ``_id``) is none now, nor are listings' page tokens: 0 of 77, and 44 of 44 credentials still masked (GCS V2's
    ``GoogleAccessId``, the signer's id as ``X-Goog-Credential`` and ``AWSAccessKeyId`` name it, is masked as they are
    now: ``test_url_secrets_formats``). A presigned URL's description still drops its dated fields with the signature
    (it names the dataset alone)."""
    from lerobot_dali.url_secrets import is_secret_param, without_credentials

    assert [name for name in _ORDINARY if is_secret_param(name)] == []
    assert [name for name in _SECRETS if not is_secret_param(name)] == []
    presigned = (
        "https://b.s3.amazonaws.com/ds?versionId=3&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20260101"
        "&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=T0K"
        "&X-Amz-Signature=S1G"
    )
    assert masked(presigned) == (
        "https://b.s3.amazonaws.com/ds?versionId=3&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
        "&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=***"
        "&X-Amz-Signature=***"
    )
    assert without_credentials(presigned) == "https://b.s3.amazonaws.com/ds?versionId=3"
    assert (
        without_credentials("s3://b/ds?list-type=2&continuation-token=c1")
        == "s3://b/ds?list-type=2&continuation-token=c1"
    )


@pytest.mark.usefixtures("no_credential_known")
def test_the_packages_records_are_masked_whatever_log_record_factory_a_user_sets() -> None:
    """Records were masked by a log record factory (``mask_every_record``) and by the filters of five modules'
    loggers: a user's ``logging.setLogRecordFactory`` set after it, calling none before it, dropped the masking of
    every other module's records and the progress lines' (3 of the 4 here named the token). Every logger of the package
    masks by filter now, whatever the factory and the handlers."""
    import io
    import logging

    from lerobot_dali import url_secrets
    from lerobot_dali.cli import _CHECK_LINES

    names = ("lerobot_dali.clips", "lerobot_dali.prefetch", _CHECK_LINES, "lerobot_dali.remote_retry")
    loggers = [logging.getLogger(name) for name in names]
    out, levels = io.StringIO(), [logger.level for logger in loggers]
    handler = logging.StreamHandler(out)
    try:
        url_secrets.mask_path_logs("a=1&token=S3CRab/cd")  # (as opening memory://b/ds?a=1&token=S3CRab/cd does)
        logging.setLogRecordFactory(logging.LogRecord)  # (a user's)
        for logger in loggers:
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.info("read %s", "memory://b/ds?a=1&token=S3CRab/cd/videos/f.mp4")
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
    assert out.getvalue().splitlines() == ["read memory://b/ds?a=1&token=***/videos/f.mp4"] * 4


def test_every_logger_of_the_package_masks_its_records() -> None:
    """Each module's logger (made as the package is imported, before a module imported later makes its own) and each
    logger the package names (its progress lines') has the masking filter: 4 of 113 had it (the modules' adding it).
    """
    import logging
    import pkgutil
    import re
    from pathlib import Path

    import lerobot_dali
    from lerobot_dali.cli import _CHECK_LINES
    from lerobot_dali.url_secrets import _MaskingFilter

    folder = Path(lerobot_dali.__file__).parent
    named = {name for p in folder.glob("*.py") for name in re.findall(r'getLogger\("([^"]+)"\)', p.read_text())}
    modules = {f"lerobot_dali.{module.name}" for module in pkgutil.iter_modules([str(folder)])}
    names = sorted({"lerobot_dali", _CHECK_LINES, *named, *modules})
    assert "lerobot_dali.bench.progress" in names and len(names) > 100
    masks = [name for name in names if any(isinstance(f, _MaskingFilter) for f in logging.getLogger(name).filters)]
    assert masks == names


def test_masked_masks_an_http_urls_user_given_without_a_password() -> None:
    """``https://TOKEN@host/ds`` (a token given as the user, which aiohttp sends as basic auth) was shown as typed
    where a text names the URL: ``lerobot-dali check`` printed (and wrote in its JSON report) the dataset that did not
    open so (1 of 1). Masked now, as a password is; another scheme's user (``sftp://alice@host``) and an e-mail
    address are no credential and stay."""
    said = "http://hf_S3CR@127.0.0.1:8000/ds: cannot open; HTTPS://hf_S3CR@h/ds?a=1"
    assert masked(said) == "http://***@127.0.0.1:8000/ds: cannot open; HTTPS://***@h/ds?a=1"
    kept = "sftp://alice@host/ds, alice@example.com, https://h/a@b, https://alice:***@h/ds"
    assert masked(kept) == kept


def test_masked_keeps_an_at_in_the_query_or_fragment_of_a_url_without_a_path() -> None:
    """An '@' after a URL's '?' or '#' is its query's or fragment's, not a user's (RFC 3986: a user holds neither):
    ``https://api.example.com?mail=me@example.org`` was shown as ``https://***@example.org`` (its host hidden, an
    e-mail address taken for a token: 3 of 3 such texts mangled); kept now, and a user before them still masked."""
    kept = "https://api.example.com?mail=me@example.org; https://h#me@example.org; https://h?to=a:b@example.org"
    assert masked(kept) == kept
    assert masked("https://hf_S3CR@h?mail=me@example.org") == "https://***@h?mail=me@example.org"


def test_a_workers_error_naming_a_credential_comes_back_masked(monkeypatch: Any) -> None:
    """DALI brings a worker's error back as an ``Exception`` holding the worker's traceback text (its error and every
    error it was raised from), raised from a ``RuntimeError`` of its message, and a builtin error of ours or a
    library's is rebuilt from them (``worker_errors``): one naming a path that keeps a URL's query (a
    ``FileNotFoundError`` raised from an ``OSError``) came back with the token in its message, and in DALI's text
    behind it (3 of 3 texts named it). Masked now, the token holding a '/' masked whole (its location opened in this
    process)."""
    import logging
    import traceback

    from lerobot_dali import url_secrets
    from lerobot_dali.worker_errors import original_worker_error
    from tests.test_worker_errors import _as_dali_raises

    monkeypatch.setattr(url_secrets, "_known", ())
    factory = logging.getLogRecordFactory()
    try:
        url_secrets.mask_path_logs("a=1&token=S3CRab/cd")  # (as the location does where it is opened)
    finally:
        logging.setLogRecordFactory(factory)
    path = "/b/ds?a=1&token=S3CRab/cd/videos/f.mp4"
    error = FileNotFoundError(f"{path} is gone")
    error.__cause__ = OSError(f"reading {path}")
    raised = _as_dali_raises(error)
    rebuilt = original_worker_error(raised)
    assert type(rebuilt) is FileNotFoundError and str(rebuilt) == "/b/ds?a=1&token=***/videos/f.mp4 is gone"
    try:
        raise rebuilt from raised  # (as the iterator raises it)
    except FileNotFoundError as caught:
        shown = "".join(traceback.format_exception(caught))
    assert "S3CR" not in shown and "cd/videos" not in shown and "OSError: reading /b/ds?a=1&token=***/videos" in shown


def test_a_remote_files_seek_before_its_start_names_its_path_masked() -> None:
    """A seek before a remote file's start (a reader seeking from the end of a file shorter than it expects) raised a
    ValueError naming its path, token and all, where the filesystem keeps the URL's query in its paths (1 of 1; an
    error of ours raised from it, masked itself, named it in its traceback). Masked now, as the prefetch cache's
    file masks it."""
    import io

    import fsspec

    from lerobot_dali.remote_retry import RetryingFileSystem
    from lerobot_dali.retry_policy import RetryPolicy

    memory = fsspec.filesystem("memory")
    path = "/h229/ds?a=1&token=S3CR/videos/f.mp4"
    memory.pipe_file(path, b"x" * 4)
    file = RetryingFileSystem(memory, policy=RetryPolicy(retries=0)).open(path, "rb")
    try:
        with pytest.raises(ValueError) as refused:
            file.seek(-8, io.SEEK_END)
    finally:
        file.close()
        memory.rm(path)
    assert str(refused.value) == "negative seek position -4 in /h229/ds?a=1&token=***/videos/f.mp4"


@pytest.mark.parametrize(
    ("said", "text", "shown"),
    [
        ("masked", "https://h/ds?sig=/S3CR+x=&a=1", "https://h/ds?sig=***&a=1"),  # (base64 may start with '/')
        ("masked", "https://h/ds?sig=S3CRab&c&x=1", "https://h/ds?sig=***&x=1"),  # (its '&' unescaped, one letter)
        ("masked", "https://h/ds?token=#frag", "https://h/ds?token=#frag"),  # (empty: nothing to mask)
        ("masked", "memory://b/ds?token=/meta/info.json", "memory://b/ds?token=/meta/info.json"),
        ("masked_key", "memory://b/ds?token=S3CR/f.mp4", "memory://b/ds?token=***/f.mp4"),
        ("masked_key", "file:///b/ds?token=x/f.mp4", "file:///b/ds?token=x/f.mp4"),  # (a local path: no URL)
        ("without_credentials", "https://u:S3CR@h/ds", "https://h/ds"),  # (no query)
        ("without_credentials", "s3://b/ds", "s3://b/ds"),
    ],
)
def test_each_text_masks_a_credential_to_its_end_and_shows_the_rest_as_it_was(said: str, text: str, shown: str) -> None:
    """Spellings the tests above do not name, each told its own way: a credential whose value starts with '/' (as
    base64's may) or holds an unescaped '&' before one letter masked to its end, an empty one left as it is (no
    '***' where nothing was), a cache's key (``masked_key``: a local file's path as it is) and a description of a
    URL without a query. (A mutation pass found each unchecked.)"""
    from lerobot_dali import url_secrets

    assert getattr(url_secrets, said)(text) == shown


def test_mask_error_masks_an_oserrors_file_name_and_leaves_what_names_no_credential_as_it_was() -> None:
    """An ``OSError``'s file name (``str()`` names it), masked; the URL of aiohttp's ``request_info`` kept as sent
    (``a=%2F``, not ``a=/``), response headers that name no credential kept as the same object (urllib's
    ``HTTPError``'s, no mapping, among them: its ``Retry-After`` is what a retry reads), and an error whose
    ``request_info`` is no aiohttp's masked without raising. (A mutation pass found each unchecked.)"""
    import email.message
    import urllib.error

    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    missing = FileNotFoundError(2, "No such file or directory", "/b/ds?token=S3CR/f.mp4")
    sent = URL("https://h/my%20ds/f.mp4?a=%2F&sig=S3CR", encoded=True)
    told = CIMultiDictProxy(CIMultiDict({"Retry-After": "3"}))
    info = aiohttp.RequestInfo(sent, "GET", CIMultiDictProxy(CIMultiDict()), sent)
    refused = aiohttp.ClientResponseError(info, (), status=503, message="Busy", headers=told)
    answered = email.message.Message()
    answered["Retry-After"] = "3"
    busy = urllib.error.HTTPError("https://h/ds?sig=S3CR", 503, "Busy", answered, None)
    other = ValueError("https://h/ds?sig=S3CR")
    other.request_info = ("GET", "https://h/ds")  # type: ignore[attr-defined]
    for error in (missing, refused, busy, other):
        assert mask_error(error) is error
    assert str(missing) == "[Errno 2] No such file or directory: '/b/ds?token=***/f.mp4'" and missing.errno == 2
    assert str(refused.request_info.url) == "https://h/my%20ds/f.mp4?a=%2F&sig=***" and refused.headers is told
    assert busy.headers is answered and busy.filename == "https://h/ds?sig=***" and busy.code == 503
    assert busy.geturl() == "https://h/ds?sig=***"  # (it kept the secret, where a handler may log it)
    assert str(other) == "https://h/ds?sig=***"


@pytest.mark.parametrize(
    "params",
    [
        {"a": "1", "sig": "S3CRab&cd=ef"},
        [("a", "1"), ("sig", "S3CRab&cd=ef")],
        "a=1&sig=S3CRab%26cd%3Def",  # (a query string: aiohttp takes one)
    ],
    ids=["mapping", "pairs", "string"],
)
@pytest.mark.usefixtures("no_credential_known")
def test_a_requests_credential_holding_an_ampersand_is_masked_whole_however_its_params_are_given(params: Any) -> None:
    """A credential sent in a request's ``params`` that holds a '&' and a '=' (``S3CRab&cd=ef``): text cannot tell its
    end, so the value told (:func:`mask_request_logs`) is masked whole, as a mapping, as name-value pairs and as a
    query string (the mapping alone was checked: a mutation pass read the other two as none, and ``cd=ef`` was
    shown)."""
    from lerobot_dali import url_secrets

    url_secrets.mask_request_logs(params)
    assert masked("url='https://h/ds?sig=S3CRab&cd=ef&a=1'") == "url='https://h/ds?sig=***&a=1'"


@pytest.mark.usefixtures("no_credential_known")
def test_a_path_query_holding_a_credential_masks_every_loggers_records_once() -> None:
    """A query kept in a filesystem's paths (:func:`mask_path_logs`) masks every record of the process as it is made
    (``mask_every_record``), whatever its logger (botocore's here, which no filter masks), and once: a query with no
    credential sets no record factory, and one told again (each location opened, each worker) wraps none again. The
    factory was not checked (the tests above set a user's over it): a mutation pass that never set it, set it again on
    each call, or made no record, passed them."""
    import logging

    from lerobot_dali import url_secrets

    logging.setLogRecordFactory(logging.LogRecord)  # (a user's, or none that masks)
    url_secrets.mask_path_logs("a=1&page=2")
    assert logging.getLogRecordFactory() is logging.LogRecord
    url_secrets.mask_path_logs("a=1&token=S3CRab/cd")
    masking = logging.getLogRecordFactory()
    url_secrets.mask_path_logs("a=1&token=S3CRab/cd")
    url_secrets.mask_every_record()
    assert logging.getLogRecordFactory() is masking is not logging.LogRecord
    path = "memory://b/ds?a=1&token=S3CRab/cd/videos/f.mp4"
    record = logging.getLogger("botocore.endpoint").makeRecord("botocore.endpoint", logging.DEBUG, __file__, 1,
        "GET %s", (path,), None)  # fmt: skip
    assert record.getMessage() == "GET memory://b/ds?a=1&token=***/videos/f.mp4"
