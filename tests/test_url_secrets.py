"""Credentials in URLs masked in text and in the errors that name them (:mod:`lerobot_dali.url_secrets`); the retries'
use over real HTTP is tested in ``test_http_remote``."""

from __future__ import annotations

import pytest

from lerobot_dali.remote_retry import _status_of, is_transient
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
    assert error.request_info.method == "GET" and _status_of(error) == 503 and is_transient(error)
    assert is_transient(timeout) and isinstance(timeout, TimeoutError)


def test_mask_error_masks_the_credential_headers_that_the_errors_repr_names() -> None:
    """A URL's ``user:password`` is sent as an ``Authorization`` header (``dataset_location``), which aiohttp's errors
    keep in their ``request_info``: ``repr`` of a failed read named it (base64 of the password), beside an
    ``X-Api-Key`` of the storage options. Masked now; the other request headers, and the response's, kept."""
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    url = URL("https://host/ds/f.mp4")
    sent = {"Authorization": "Basic YWxpY2U6czNjcmV0", "x-api-key": "k3y", "Range": "bytes=0-9"}
    info = aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict(sent)), url)
    error = aiohttp.ClientResponseError(info, (), status=429, message="Too Many", headers={"Retry-After": "3"})
    mask_error(error)
    assert "YWxpY2U6czNjcmV0" not in repr(error) and "k3y" not in repr(error), repr(error)
    assert dict(error.request_info.headers) == {"Authorization": "***", "x-api-key": "***", "Range": "bytes=0-9"}
    assert error.request_info.url == url and error.headers == {"Retry-After": "3"} and _status_of(error) == 429
