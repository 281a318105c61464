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
