"""Spellings of :mod:`lerobot_dali.url_secrets` that the other tests leave unchecked, each pinned to its exact text (a
mutation pass over the module found each one unchecked: a change to it passed every test)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lerobot_dali.url_secrets import is_secret_param, masked, without_credentials


def test_a_name_is_a_credential_by_its_last_credential_word() -> None:
    """A word that tells of a credential (``type``, ``method``) only ends being one where no credential's word comes
    after it: ``auth_type_token`` carries a token, ``token_type`` does not."""
    assert [is_secret_param(name) for name in ("auth_type_token", "key_method_sig", "token_type")] == [
        True,
        True,
        False,
    ]
    assert masked("https://h/ds?auth_type_token=S3CR&a=1") == "https://h/ds?auth_type_token=***&a=1"


@pytest.mark.parametrize(
    ("target", "described"),
    [
        ("memory://?a=1&token=S3CR", "memory://?a=1"),  # (its '//' kept: urlunsplit drops it)
        ("s3://b/ds?token=S3CR", "s3://b/ds"),  # (every parameter dropped: no '?' left behind)
        ("s3://b/ds?v&token=S3CR&a=1", "s3://b/ds?v&a=1"),  # (a first segment without '=' is no credential's)
        ("s3://b/ds?", "s3://b/ds?"),  # (no user: spelled as typed)
        ("memory://b/ds#a?token=S3CR&v=2", "memory://b/ds#a?v=2"),  # (a '?' after a '#': fsspec's paths keep both)
        ("https://h/ds#frag?token=S3CR", "https://h/ds#frag"),
    ],
)
def test_a_description_drops_exactly_the_credentials_and_keeps_the_rest_as_typed(target: str, described: str) -> None:
    """A description (:func:`without_credentials`) is the URL as typed without its credentials: its '//' and its
    empty query kept, no '?' left where every parameter went, a segment without '=' that starts the query kept (it is
    no credential's unescaped '&'), and a query after a '#' masked as the logs mask it (a memory filesystem's path
    keeps both, and the location masks its logs by what follows the first '?'; an http(s) URL with a '#' is refused
    by an error that names its description)."""
    assert without_credentials(target) == described


def test_an_http_urls_start_is_found_only_before_the_query_of_a_path() -> None:
    """A path that keeps a query (``memory://``) names a file after its credential's value: ``/`` ends it there, also
    where another parameter's value is an http(s) URL, or the text starts at the '?'; in an http(s) URL a '/' is the
    value's own."""
    assert masked("memory://b/ds?next=http://h/x&token=S3CR/meta/info.json") == (
        "memory://b/ds?next=http://h/x&token=***/meta/info.json"
    )
    assert masked("?token=S3CR/x&next=http://h") == "?token=***/x&next=http://h"
    assert masked("https://h/ds?token=S3CR/x&a=1") == "https://h/ds?token=***&a=1"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://h/ds?sig=S3CR&&a=1", "https://h/ds?sig=***&&a=1"),  # (an empty segment: the separators kept)
        ("https://h/ds?sig=S3CR&", "https://h/ds?sig=***&"),
        ("memory://b/ds?sig=S3CR&/f.bin", "memory://b/ds?sig=***&/f.bin"),
        ("https://h/ds?sig=S3CRab==&cd&x=1", "https://h/ds?sig=***&x=1"),  # (its '&' unescaped, after base64's '=')
    ],
)
def test_a_credential_ends_at_the_segment_after_it_that_holds_an_equals_sign_or_nothing(text: str, shown: str) -> None:
    """A credential's value takes the segments without '=' after it (its '&' unescaped), however its own value ends
    (base64's '=' padding), and no empty one: the '&' of an empty segment, or one that ends the text, is shown."""
    assert masked(text) == shown


def test_mask_error_leaves_an_error_naming_no_credential_as_it_was() -> None:
    """An aiohttp error whose request names no credential keeps its very ``request_info``, and an error of another
    kind gets no attribute it did not have (a ``headers``, a ``history``)."""
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    from lerobot_dali.url_secrets import mask_error

    aiohttp = pytest.importorskip("aiohttp", reason="the errors masked are aiohttp's (the 'test' extra)")
    url = URL("https://h/ds/f.mp4?a=1")
    info = aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict({"Range": "bytes=0-9"})), url)
    refused = aiohttp.ClientResponseError(info, (), status=503, message="Busy")
    plain = ValueError("https://h/ds?a=1")
    assert mask_error(refused) is refused and refused.request_info is info
    assert mask_error(plain) is plain and vars(plain) == {} and plain.args == ("https://h/ds?a=1",)


def test_mask_error_masks_the_text_arguments_of_an_error_and_keeps_the_others() -> None:
    """An error made of a status and a URL (``args == (503, url)``) has its URL masked and its status kept as it was."""
    from lerobot_dali.url_secrets import mask_error

    error = mask_error(RuntimeError(503, "https://h/ds?sig=S3CR&a=1", None))
    assert error.args == (503, "https://h/ds?sig=***&a=1", None)


def test_a_masked_redirect_keeps_its_status_and_its_url_masked() -> None:
    """The redirects of a masked error's ``history`` keep their status and URL (masked), as aiohttp's responses
    give them."""
    from lerobot_dali.url_secrets import _Redirect

    response = SimpleNamespace(status=302, url="https://h/ds/f.mp4?sig=S3CR&a=1")
    redirect = _Redirect(response)
    assert (redirect.status, redirect.url) == (302, "https://h/ds/f.mp4?sig=***&a=1")
    assert repr(redirect) == masked(repr(response)) == repr(response).replace("S3CR", "***")


def test_the_masking_filter_leaves_a_record_naming_no_credential_as_it_was_made() -> None:
    """A record that names no credential keeps its message and its arguments (a handler may read them), and one whose
    arguments its message does not take is said with them (the handler would fail to format it), credential or none.
    """
    import logging

    from lerobot_dali.url_secrets import _MaskingFilter

    arguments = ("https://h/ds?a=1",)
    kept = logging.LogRecord("fsspec", logging.DEBUG, __file__, 1, "read %s", arguments, None)
    unmade = logging.LogRecord("fsspec", logging.DEBUG, __file__, 1, "read %d", arguments, None)
    assert _MaskingFilter().filter(kept) and _MaskingFilter().filter(unmade)
    assert (kept.msg, kept.args) == ("read %s", arguments)
    assert unmade.getMessage() == "read %d (arguments the message does not take: ('https://h/ds?a=1',))"


@pytest.mark.parametrize("told", ["request", "path"])
@pytest.mark.usefixtures("no_credential_known")
def test_the_request_loggers_mask_once_a_credential_is_told_and_not_before(
    told: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsspec's and the object stores' loggers get the masking filter once a request's ``params`` or a path's query
    holds a credential (whatever an earlier test added: their filters start empty here), and none for a query that
    holds none."""
    import logging

    from lerobot_dali import url_secrets

    loggers = [logging.getLogger(name) for name in url_secrets._REQUEST_LOGGERS]
    for logger in loggers:
        monkeypatch.setattr(logger, "filters", [])
    tell = url_secrets.mask_request_logs if told == "request" else url_secrets.mask_path_logs
    tell("a=1&page=2")
    assert [logger.filters for logger in loggers] == [[]] * len(loggers) and url_secrets._known == ()
    tell("a=1&sig=S3CR")
    tell("a=1&sig=S3CR")  # (told again: each location opened, each worker)
    masks = [[type(f) for f in logger.filters] for logger in loggers]
    assert masks == [[url_secrets._MaskingFilter]] * len(loggers) and url_secrets._known == ("S3CR",)
