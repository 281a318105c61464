"""Credentials that URLs carry (a signed URL's ``sig``, ``X-Amz-Signature``, a ``token``; a ``user:password@``), left
out of a dataset's description (:func:`without_credentials`: saved in states, logged) and masked wherever else a URL
is said.

An http(s) dataset URL's query is sent with every request (:mod:`~lerobot_dali.dataset_location` moves it to the
requests' ``params``), so aiohttp's errors name each request's URL with it: ``ClientResponseError``'s text is
"503, message='Service Unavailable', url='https://host/ds/data/file-000.parquet?sig=...'", and a connection timeout's
is "Connection timeout to host <url>". The retries log those errors, add notes to them and raise them:
:func:`mask_error` masks them where the retries catch them, and where a stamp asked again outside them raises them
(:meth:`FileStamps.change_now <lerobot_dali.file_stamps.FileStamps.change_now>`), so every line and message made of
them after is clean.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pkgutil
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from . import fork_locks

__all__ = [
    "MASK",
    "is_secret_param",
    "mask_error",
    "mask_every_record",
    "mask_path_logs",
    "mask_request_logs",
    "masked",
    "masked_key",
    "masking",
    "without_credentials",
]

#: What a credential is replaced with in text (``?sig=***&scope=all``).
MASK = "***"

#: Query parameter names that carry a credential (case-insensitive; ``-``, ``_``, ``.``, a space and camelCase split a
#: name into words, and a name holding one of these words is one too: ``access_token``, ``apiKey``, ``X-Amz-Signature``,
#: ``X-Amz-Credential``, Azure SAS's ``sig``): whole words, so ``monkey``, ``passage``, ``author`` or ``tokenizer`` are
#: none; nor is one where a word of :data:`_ABOUT_WORDS` follows it. Other parameters (S3's ``versionId``, a
#: ``revision``, a signed URL's ``X-Amz-Date`` and ``X-Amz-Expires``) are no secret and say which data is read, or
#: why a signature was refused, so they are kept.
_SECRET_WORDS = frozenset(
    {
        "token", "sig", "signature", "secret", "password", "passwd", "credential", "credentials", "auth",
        "authorization", "key", "apikey", "session", "sessionid", "jwt", "cookie", "bearer", "hmac",
        "sign",  # (Tencent's and Qiniu's signed CDN URLs: ``?sign=...``; ``design``, ``signed``, ``signal`` are none)
        # (written as one word)
        "accesstoken", "accesskey", "accesskeyid", "awsaccesskeyid", "secretkey", "sessiontoken", "securitytoken",
        "authtoken", "apitoken", "privatekey", "privatetoken", "clientsecret", "idtoken", "refreshtoken",
    }
)  # fmt: skip
#: How the names of an access key's id end, whatever its service (S3's v2 ``AWSAccessKeyId``, OSS's
#: ``OSSAccessKeyId``), and a session's id: credentials, though ``Id`` is one of :data:`_ABOUT_WORDS`.
_SECRET_ENDINGS = ("accesskeyid", "sessionid")
#: Names that carry a credential only as the whole name (``pass=...``; ``pass_rate`` is none): Azure Functions' key
#: (``code``), a one-time password, a CAS service ticket, PHP's session (``PHPSESSID``), Akamai's tokens (Auth Token
#: 2.0's ``hdnts``, and ``hdnea``, ``hdntl``: ``exp=...~acl=...~hmac=...``), and the access key's id of Tencent COS's
#: signature (``q-ak``) and of GCS's V2 signed URLs (``GoogleAccessId``: the signer's, as V4's ``X-Goog-Credential``
#: and S3's ``AWSAccessKeyId`` name it).
_SECRET_NAMES = frozenset(
    {"pass", "pwd", "pw", "code", "otp", "ticket", "phpsessid", "hdnts", "hdnea", "hdntl", "q-ak", "googleaccessid"}
)
#: Words that, after a credential's word, make a name one that tells of a credential, not one that carries it
#: (``signature_version``, ``SignatureMethod``, ``key-marker``, ``token_type``, ``key_id``, ``sign_in``, Tencent COS's
#: ``q-sign-time`` and ``q-key-time``, a key's name: ``authKeyName=opds``, the path a token is for: Bunny CDN's
#: ``token_path``).
_ABOUT_WORDS = frozenset(
    {"version", "method", "type", "marker", "id", "in", "name", "count", "algorithm", "expires", "time", "path"}
)
#: Names (their words joined, lower-case) that hold a credential's word but carry none: the pages of a
#: listing (S3's ``continuation-token``, GCS's ``pageToken``, a ``next_token``) and a sort order's key.
_PLAIN_NAMES = frozenset({"continuationtoken", "pagetoken", "nextpagetoken", "nexttoken", "sortkey"})
#: A name's words: an upper-case run (``AWS``), a capitalised or lower-case word, digits.
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
#: Parameters that make a query a signed URL's (Azure SAS's ``sig``, CloudFront's and GCS v2's ``Signature``), and the
#: fields of such signatures that are no secret but change with each one signed (Azure SAS's ``sv``, ``se``, ``sp``,
#: ``st``, ``sr``, ``skoid``...; CloudFront's ``Expires``, ``Policy``, ``Key-Pair-Id``; S3's, GCS's and OSS V4's
#: ``X-Amz-Date``, ``X-Goog-Expires``, ``x-oss-date``...; Tencent COS's ``q-sign-time``...): left out of a
#: description with the signature, which would otherwise name the dataset anew each time the URL is signed again; kept
#: (and shown) in other queries and in messages.
_SIGNATURES = frozenset({"sig", "signature", "x-amz-signature", "x-goog-signature", "x-oss-signature", "q-signature"})
_SIGNED_FIELDS = frozenset(
    {
        "sv", "ss", "srt", "sp", "se", "st", "spr", "sip", "sr", "sdd", "si", "ses", "skoid", "sktid", "skt", "ske",
        "sks", "skv", "saoid", "suoid", "scid", "rscc", "rscd", "rsce", "rscl", "rsct", "expires", "policy",
        "googleaccessid", "key-pair-id", "x-amz-date", "x-amz-expires", "x-amz-algorithm", "x-amz-signedheaders",
        "x-amz-content-sha256", "x-goog-date", "x-goog-expires", "x-goog-algorithm", "x-goog-signedheaders",
        "x-oss-signature-version", "x-oss-date", "x-oss-expires", "x-oss-additional-headers", "q-sign-algorithm",
        "q-sign-time", "q-key-time", "q-header-list", "q-url-param-list",
    }
)  # fmt: skip
#: A query parameter's name in text, after '?' or '&', and its '=': in an http(s) URL (or after its '#': a fragment's,
#: an OAuth implicit grant's ``#access_token=...``), and in a filesystem's path that keeps a query
#: (``memory://b/ds?token=x/meta/info.json``: a file's path is the root's with its own appended), where a name holds no
#: '/'. A credential's value runs from there (:func:`_secret_end`).
_QUERY_NAME = re.compile(r"[?&#](?P<name>[^=&#?\s'\"]+)=")
_PATH_NAME = re.compile(r"[?&](?P<name>[^=&#?/\s'\"]+)=")
#: A run of text that may be a URL or a path (no white space, quote or angle bracket: ``<url>``, as a ``Link`` header
#: names it), and an http(s) URL's start in it.
_URL_LIKE = re.compile(r"[^\s'\"<>]+")
_HTTP = re.compile(r"https?://", re.IGNORECASE)
#: The credentials of the queries of this process's filesystems that keep them in their paths, and of its http(s)
#: requests' ``params`` (:func:`mask_path_logs`, :func:`mask_request_logs`), as written and unescaped, longest first:
#: where a value holds a '/', a '&' or a '#' (``?sig=ab/cd``), text alone cannot tell where it ends in a path
#: (``...?sig=ab/cd/meta/info.json``), so a value known is masked whole.
_known: tuple[str, ...] = ()
_known_lock = fork_locks.lock()
#: A URL's ``user:password@`` (aiohttp sends it as basic auth), to its last '@' (a password may hold one). The user
#: holds no '?' or '#' (RFC 3986's userinfo): in ``https://host?mail=a:b@c`` the '@' is the query's, not a user's.
_USER_PASSWORD = re.compile(r"(?P<lead>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#@:\s'\"]*):[^/?#\s'\"]+@")
#: An http(s) URL's user without a password (``https://TOKEN@host``, or with an empty one: ``https://TOKEN:@host``,
#: as curl's ``-u TOKEN:`` gives it: aiohttp sends it as basic auth, as a token is given so); another scheme's
#: (``sftp://alice@host``) names no credential.
_USER_ALONE = re.compile(r"(?P<lead>\bhttps?://)[^/?#@:\s'\"]+:?@", re.IGNORECASE)
#: Credentials that known formats carry in a URL's path, or in its user where its password is none, each masked after
#: its ``lead`` (each format's own: no guess at other paths, whose ``name=value`` is a Hive partition's too, which
#: :func:`masked_key` would make one key): a Telegram bot's token (``https://api.telegram.org/bot<id>:<token>/getMe``,
#: ``.../file/bot<id>:<token>/<path>``; the bot's id is kept), a Java servlet's session (``/f.mp4;jsessionid=<id>``),
#: and a GitHub token given as the user (``https://<token>:x-oauth-basic@github.com/o/r.git``, as GitHub's docs spell
#: it).
_PATH_SECRETS = (
    re.compile(r"(?P<lead>\bhttps?://api\.telegram\.org/(?:file/)?bot[0-9]+:)[A-Za-z0-9_-]+", re.IGNORECASE),
    re.compile(r"(?P<lead>;jsessionid=)[^;/?#&\s'\"]+", re.IGNORECASE),
    re.compile(r"(?P<lead>\bhttps?://)[^/?#@:\s'\"]+(?=:x-oauth-basic@)", re.IGNORECASE),
)


def is_secret_param(name: str) -> bool:
    """Whether query parameter ``name`` (percent-encoded or not) carries a credential: one of :data:`_SECRET_NAMES`, one
    that ends as an access key's id does (:data:`_SECRET_ENDINGS`), or one holding a word of :data:`_SECRET_WORDS` that
    no word of :data:`_ABOUT_WORDS` follows (and not one of :data:`_PLAIN_NAMES`)."""
    name = unquote(name.replace("+", " ")).strip()
    words = [word.lower() for word in _WORDS.findall(name)]
    joined = "".join(words)
    if name.lower() in _SECRET_NAMES or joined.endswith(_SECRET_ENDINGS):
        return True
    last = max((at for at, word in enumerate(words) if word in _SECRET_WORDS), default=None)
    return last is not None and joined not in _PLAIN_NAMES and _ABOUT_WORDS.isdisjoint(words[last + 1 :])


def without_credentials(target: str) -> str:
    """``target`` (a URL) without the user and password it may carry (``https://user:token@host/ds``, which aiohttp
    sends as basic auth) and without its query's credentials (:func:`is_secret_param`:
    ``s3://b/ds?versionId=3&X-Amz-Signature=...`` keeps ``versionId=3``; a signed URL's other fields with them,
    :data:`_SIGNED_FIELDS`), whatever its scheme: a location's description is logged, written in reports and saved in
    every stream state (a checkpoint's ``dataset_descriptions``), so it names the dataset alone. The parameters kept
    are kept as written (their escapes, order and separators). The filesystem is built from ``target`` as given, so its
    requests still send them. (An http(s) URL's query was moved to the requests' ``params`` before: its description
    has none.)"""
    parts = urlsplit(target)
    if "@" in parts.netloc:
        target = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    if "?" not in target:  # (not ``parts.query``: a '?' after a '#' starts the query a filesystem's paths keep)
        return target
    before, _, after = target.partition("?")  # (spelled as typed: urlunsplit drops the '//' of 'scheme://?a=b')
    segments = after.split("&")  # (a '#' in a credential's value is its own: fsspec's memory filesystem keeps it)
    names = [segment.partition("=")[0].partition("#")[0] for segment in segments]
    plain = [unquote(name.replace("+", " ")).strip().lower() for name in names]
    signed = not _SIGNATURES.isdisjoint(plain)
    kept, dropping = [], False
    for segment, name, lower in zip(segments, names, plain, strict=True):
        # (a segment without '=' after a credential is its '&' unescaped: ``?sig=ab&cd``)
        dropping = (dropping and "=" not in segment) or is_secret_param(name) or (signed and lower in _SIGNED_FIELDS)
        if not dropping:
            kept.append(segment)
    if len(kept) == len(segments):
        return target
    query = "&".join(kept)
    return f"{before}{'?' if query else ''}{query}"


def masked(text: str) -> str:
    """``text`` with the credentials of the URLs it names replaced by :data:`MASK`: the values of their credential-like
    query parameters (:func:`is_secret_param`; an http(s) URL's fragment's too), their passwords, and an http(s) URL's
    user where it has no password (:data:`_USER_ALONE`), and those of the known formats of :data:`_PATH_SECRETS`; the
    rest as it was."""
    for secret in _PATH_SECRETS:
        text = secret.sub(rf"\g<lead>{MASK}", text)
    shown = _USER_PASSWORD.sub(rf"\g<lead>:{MASK}@", _URL_LIKE.sub(_masked_url, text))
    return _USER_ALONE.sub(rf"\g<lead>{MASK}@", shown)


def masked_key(url: str) -> str:
    """``url``, a remote file's that a cache on disk keys and writes (a packet index's), with its credentials masked
    (:func:`masked`): a filesystem that keeps a URL's query in its paths (``memory://b/ds?token=...``) named the token
    in every entry written. Its other parameters are kept, so two files they tell apart are two keys; two spellings
    of one file that only its credentials tell apart (a URL signed again) are one. A local file's (``file://``), whose
    path is no URL's, and one with no credential are as they are: their keys and entries stay valid."""
    return url if url.startswith("file://") else masked(url)


def _masked_url(run: re.Match[str]) -> str:
    """A run of text without white space (:data:`_URL_LIKE`) with its credential-like query parameters' values masked
    (:func:`_secret_end`)."""
    text = run[0]
    if "=" not in text:
        return text
    query = text.find("?")
    http = _HTTP.search(text, 0, query if query >= 0 else len(text)) is not None
    said, done = [], 0
    for param in (_QUERY_NAME if http else _PATH_NAME).finditer(text):
        empty = param.end() == len(text) or text[param.end()] in "&#/"[: 2 if http else 3]  # (``token=&a=1``)
        if param.start() >= done and not empty and is_secret_param(param["name"]):
            said += [text[done : param.end()], MASK]
            done = _secret_end(text, param.end(), http=http)
    return "".join(said) + text[done:] if said else text


def _secret_end(text: str, start: int, *, http: bool) -> int:
    """Where the value of a credential that starts at ``start`` in ``text`` (a run without white space) ends: at the
    next '&' (and, in a path, '/': the file's path after the root's query) after the longest value :data:`_known` it
    begins with, or after ``start``; a '#' and the segments without '=' after it (``?sig=ab&cd``) taken with it: a
    value that holds either is none the less a credential's, which a path keeps as written (fsspec's memory
    filesystem keeps '#' and '&')."""
    stops = "&" if http else "&/"
    known = next((start + len(value) for value in _known if text.startswith(value, start)), start)
    end = _next_of(text, known, stops)  # (to the next stop after it too: one known may begin another credential)
    while end < len(text) and text[end] == "&":  # (a segment without '=' after it: the credential's '&' unescaped)
        after = _next_of(text, end + 1, stops)
        if after == end + 1 or "=" in text[end + 1 : after]:
            break
        end = after
    return end


def _next_of(text: str, start: int, stops: str) -> int:
    return min((i for i in (text.find(c, start) for c in stops) if i >= 0), default=len(text))


def mask_error(error: BaseException) -> BaseException:
    """``error`` and the errors behind it (its ``__cause__`` and ``__context__``, and theirs) with the credentials of
    the URLs their text names masked (:func:`masked`), in place, and returned: the URL of aiohttp's ``request_info``
    (``ClientResponseError``'s text), its request headers' credentials and the redirects of its ``history`` (its
    ``repr``), their messages (``args``; an ``OSError``'s ``strerror`` and file names; urllib's ``HTTPError``'s ``url``)
    and their notes. Their type, status and response headers stay, which the retries' checks read."""
    pending, seen = [error], set()
    while pending:
        one = pending.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        _mask_one(one)
        pending += [e for e in (one.__cause__, one.__context__) if e is not None]
    return error


def _mask_one(error: BaseException) -> None:
    info = getattr(error, "request_info", None)
    if isinstance(info, tuple) and hasattr(info, "_replace") and hasattr(info, "real_url"):  # (aiohttp's RequestInfo)
        changed: dict[str, Any] = {}
        for name in ("url", "real_url"):
            url = getattr(info, name)
            if masked(str(url)) != str(url):
                changed[name] = type(url)(masked(str(url)), encoded=True)  # (yarl's URLs, spelled as sent)
        headers = getattr(info, "headers", None)
        if _masked_headers(headers) is not headers:
            changed["headers"] = _masked_headers(headers)
        if changed:
            error.request_info = info._replace(**changed)  # type: ignore[attr-defined]
    answered = getattr(error, "headers", None)  # (the response's: a Set-Cookie, a Location; its repr names them)
    if _masked_headers(answered) is not answered:
        error.headers = _masked_headers(answered)  # type: ignore[attr-defined]
    history = getattr(error, "history", None)
    if isinstance(history, tuple) and any(_shown(response) != repr(response) for response in history):
        error.history = tuple(_Redirect(response) for response in history)  # type: ignore[attr-defined]
    if any(isinstance(arg, str) and masked(arg) != arg for arg in error.args):
        error.args = tuple(masked(arg) if isinstance(arg, str) else arg for arg in error.args)
    # An OSError's text fields; urllib's HTTPError's url (its geturl(): a handler may log it).
    for name in (*(("strerror", "filename", "filename2") if isinstance(error, OSError) else ()), "url"):
        value = getattr(error, name, None)
        if isinstance(value, str) and masked(value) != value:
            with contextlib.suppress(AttributeError):  # (a read-only url: its text is the args' above)
                setattr(error, name, masked(value))
    notes = getattr(error, "__notes__", None)
    if isinstance(notes, list) and any(isinstance(n, str) and masked(n) != n for n in notes):
        error.__notes__ = [masked(n) if isinstance(n, str) else n for n in notes]  # type: ignore[attr-defined]


class _Redirect:
    """A response a failed request was redirected by (aiohttp's ``ClientResponse``, in its error's ``history``, whose
    ``repr`` names it: the URL asked, the query's credentials in it, and the headers, ``Location`` with the next URL),
    masked: its status and URL, and its ``repr``."""

    def __init__(self, response: Any) -> None:
        self.status = getattr(response, "status", None)
        self.url = masked(str(getattr(response, "url", "")))
        self._shown = _shown(response)

    def __repr__(self) -> str:
        return self._shown


def _shown(response: Any) -> str:
    """``repr(response)`` (aiohttp's ``ClientResponse``: its URL, then its headers), its URLs' credentials and the
    values of its credential headers (a ``Set-Cookie``) masked."""
    shown = repr(response)
    headers = getattr(response, "headers", None)
    if _masked_headers(headers) is not headers:
        shown = shown.replace(repr(headers), repr(_masked_headers(headers)))
    return masked(shown)


def _masked_headers(headers: Any) -> Any:
    """A request's or response's ``headers`` (aiohttp's, in its errors' ``request_info`` and ``headers``: their
    ``repr`` names them) with the values of those that carry a credential (:func:`_is_secret_header`) replaced by
    :data:`MASK`, and the credentials of the URLs the others name masked (:func:`masked`: a redirect's ``Location``,
    a ``Link``, signed too), the rest kept (``Retry-After``, which the retries read); ``headers`` itself where that
    changes none (or it is no mapping)."""
    if not isinstance(headers, Mapping):
        return headers
    said = list(headers.items())
    shown = [(n, MASK if _is_secret_header(str(n)) else masked(v) if isinstance(v, str) else v) for n, v in said]
    if shown == said:
        return headers
    from multidict import CIMultiDict, CIMultiDictProxy  # (aiohttp's: installed wherever its errors are raised)

    return CIMultiDictProxy(CIMultiDict(shown))


def _is_secret_header(name: str) -> bool:
    """Whether header ``name`` carries a credential: one whose name holds one (:func:`is_secret_param`:
    ``Authorization``, which carries a URL's ``user:password`` in base64, an ``X-Api-Key``, an
    ``X-Amz-Security-Token``), ``Cookie`` (a session's, or CloudFront's signed cookies: the signature of a signed URL,
    sent as cookies) or ``Set-Cookie`` (a response's)."""
    return is_secret_param(name)


#: The loggers of the libraries under our reads that name a request's URL with its query: fsspec's HTTP filesystem
#: logs at DEBUG the traceback of a HEAD that failed (aiohttp's error, before it asks with a GET); fsspec's others, and
#: the object stores', name the paths they are asked for, which keep a query where the filesystem does
#: (``memory://b/ds?token=...``: its memory filesystem logs each ``cat`` at DEBUG).
_REQUEST_LOGGERS = (
    "fsspec.http",
    "fsspec",
    "fsspec.memoryfs",
    "fsspec.local",
    "fsspec.caching",
    "s3fs",
    "gcsfs",
    "adlfs",
)


class _MaskingFilter(logging.Filter):
    """Masks the credentials of the URLs a record names (:func:`masked`), in place: its message as its arguments make
    it (of any kind: a mapping, an object whose text names a URL), its exception (:func:`mask_error`) and that
    exception's text where it was formatted already. It never raises (a filter's error is its logging caller's): a
    message its arguments do not make is given as the masked text of both, an exception it cannot mask is left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message, made = record.getMessage(), True
        except Exception:  # (the handler would print both as they are: said masked here instead)
            message, made = f"{_text(record.msg)} (arguments the message does not take: {_text(record.args)})", False
        shown = masked(message)
        if shown != message or not made:
            record.msg, record.args = shown, None
        if isinstance(record.exc_text, str):
            record.exc_text = masked(record.exc_text)
        if record.exc_info and record.exc_info[1] is not None:
            try:
                mask_error(record.exc_info[1])
            except Exception:  # (an error whose parts do not read as aiohttp's: not shown rather than unmasked)
                record.msg, record.args = f"{record.msg} (its exception not shown: it could not be masked)", None
                record.exc_info, record.exc_text = None, None
        return True


def _text(value: object) -> str:
    """``str(value)``, or where that raises its type and id."""
    try:
        return str(value)
    except Exception:
        return object.__repr__(value)


def mask_request_logs(params: Any) -> None:
    """Where a filesystem's request ``params`` (an http(s) URL's query, sent with every request: name-value pairs or a
    mapping; another URL's query, kept in its paths, as a string) hold a credential (:func:`is_secret_param`), the
    records of :data:`_REQUEST_LOGGERS` masked from now on in this process (:class:`_MaskingFilter`, added once): a
    user's DEBUG logging named the query in their tracebacks. (The logging module asks a logger's filters only of
    records at a level it logs: none costs a thing at the default levels.)"""
    if isinstance(params, str):  # (aiohttp takes a query string too)
        params = parse_qsl(params, keep_blank_values=True)
    pairs = params.items() if isinstance(params, Mapping) else params or ()
    secrets = [str(value) for name, value in pairs if is_secret_param(str(name))]
    if not secrets:
        return
    _remember(secrets)
    for name in _REQUEST_LOGGERS:
        masking(logging.getLogger(name))


def mask_path_logs(query: str) -> None:
    """Where ``query`` (as written after the '?'), of a URL whose filesystem keeps it in its paths
    (``memory://b/ds?token=...``: any but http(s), whose query is sent as ``params``), holds a credential, every record
    of this process masked from now on (:func:`mask_every_record`): any module's, fsspec's, the object stores' and
    their clients' name such paths (the clips' and packet indexes' DEBUG lines each file's: 74 of the 98 DEBUG lines of
    an epoch read over ``memory://``), and its values are masked whole wherever a text names them after their
    parameter's name (:data:`_known`: ``?sig=ab/cd/meta/info.json``). The package's own records are masked whatever
    the record factory (:func:`_mask_package_logs`), and so are :data:`_REQUEST_LOGGERS`' (a user's factory set after
    ours that does not call it drops it for the others). The location calls this where it is made and where a worker
    unpickles it."""
    segments = query.split("&")
    secrets = []
    for at, segment in enumerate(segments):
        name, equals, value = segment.partition("=")
        if equals and is_secret_param(name.partition("#")[0]):
            bare = list(itertools.takewhile(lambda s: "=" not in s, segments[at + 1 :]))  # (its '&' unescaped)
            secrets += ["&".join([value, *bare]), value]
    if secrets:
        _remember(secrets)
        mask_every_record()
        for logger in _REQUEST_LOGGERS:
            masking(logging.getLogger(logger))


def _remember(values: Iterable[str]) -> None:
    """Add ``values`` (credentials, as written) and their unescaped spellings to :data:`_known`."""
    global _known
    with _known_lock:
        known = {*_known, *values, *(unquote(value) for value in values)}
        _known = tuple(sorted((value for value in known if value), key=len, reverse=True))


#: The mark of a log record factory that masks (:func:`mask_every_record`).
_MASKS = "_lerobot_dali_masks"
_factory_lock = fork_locks.lock()


def mask_every_record() -> None:
    """Mask the credentials every log record of this process names (:class:`_MaskingFilter`) as it is made, whatever
    its logger (``logging.setLogRecordFactory``, over the factory in place; once): a logger's filter is asked only of
    the records made on it, and a handler's only of those it is given, so where paths keep a credential the records
    of loggers no filter was added to named it (fsspec's, aiohttp's, botocore's; the package's own loggers mask by
    filter, :func:`_mask_package_logs`, which a user's record factory cannot undo). DALI's spawned workers call it
    where they set up their logging
    (:func:`~lerobot_dali.worker_start.log_like_trainer`). A record is made only at a level its logger logs: none at
    the default levels."""
    with _factory_lock:
        made = logging.getLogRecordFactory()
        if getattr(made, _MASKS, False):
            return
        mask = _MaskingFilter()

        def masked_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = made(*args, **kwargs)
            mask.filter(record)
            return record

        setattr(masked_record, _MASKS, True)
        logging.setLogRecordFactory(masked_record)


def masking(logger: logging.Logger) -> logging.Logger:
    """``logger``, its records masked (:class:`_MaskingFilter`, added once): the modules that name a remote file's path
    in their lines (retries, stamps, the prefetch cache), where a filesystem keeps a URL's query in its paths
    (``memory://b/ds?token=...``, any whose ``_strip_protocol`` keeps '?'). (A logger's filters are asked only of
    records at a level it logs.)"""
    if not any(isinstance(f, _MaskingFilter) for f in logger.filters):
        logger.addFilter(_MaskingFilter())
    return logger


#: The package's loggers that are no module's: its progress lines' (``bench``'s, ``check``'s).
_PROGRESS_LOGGERS = ("lerobot_dali.bench.progress", "lerobot_dali.check.progress")


def _mask_package_logs() -> None:
    """Every logger of this package masked (:func:`masking`): its modules' (made here, before a module imported later
    makes its own by the same name, and finds it masking) and its progress lines'. A logger's filter is asked of every
    record made on it, whatever the process's log record factory and handlers: a user's ``setLogRecordFactory`` after
    :func:`mask_every_record`'s (one that does not call the factory it replaces) dropped the masking of every module's
    records but the four whose loggers masked. Called as this module is imported (the package's ``__init__`` imports
    it, through :mod:`~lerobot_dali.errors`), in DALI's spawned workers too."""
    package = __name__.rpartition(".")[0]
    modules = [module.name for module in pkgutil.iter_modules([os.path.dirname(__file__)])]
    for name in [package, *(f"{package}.{module}" for module in modules), *_PROGRESS_LOGGERS]:
        masking(logging.getLogger(name))


_mask_package_logs()
