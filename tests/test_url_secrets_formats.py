"""Credential masking (:mod:`lerobot_dali.url_secrets`) measured on the signed-URL formats of the object stores and CDNs
a dataset is read from, as their own documentation spells them: every parameter that carries a credential masked in
text (:func:`masked`), every other one (dates, expiries, algorithms, regions, identifiers, page tokens) shown."""

from __future__ import annotations

from urllib.parse import urlsplit

from lerobot_dali.url_secrets import MASK, masked

#: The query parameters of real signed URLs, each format's URL written with the parameters its documentation lists,
#: the credentials' values starting with ``S3CR`` (no other value does). An access key's id is masked wherever a
#: format sends it (S3's ``AWSAccessKeyId`` and ``X-Amz-Credential``, GCS's ``GoogleAccessId`` and
#: ``X-Goog-Credential``, OSS's, COS's ``q-ak``, OBS's ``AccessKeyId``): it is half of the key pair that signs (AWS:
#: "manage your access keys as securely as you do your user name and password") and names the account. The ids of
#: public keys and directory objects are shown: CloudFront's ``Key-Pair-Id`` names a public key registered with the
#: distribution (the private key never leaves the signer), Azure's ``skoid``/``sktid`` the Entra ID object and tenant
#: GUIDs a user delegation key was issued to (the key itself is never in the URL); a ``Policy`` is the signed document
#: (the resource and conditions), no key. A page token or continuation marker says where a listing goes on.
FORMATS: dict[str, str] = {
    # docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html (Cloudflare R2's presigned URLs too)
    "S3 SigV4 query": "https://b.s3.us-east-1.amazonaws.com/ds/f.mp4?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=S3CRakia%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20260101T000000Z"
    "&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=S3CRtok&X-Amz-Signature=S3CRsig&x-id=GetObject"
    "&versionId=3",
    # docs.aws.amazon.com/AmazonS3/latest/userguide/RESTAuthentication.html#RESTAuthenticationQueryStringAuth
    "S3 SigV2 query": "https://b.s3.amazonaws.com/ds/f.mp4?AWSAccessKeyId=S3CRakia&Expires=1767225600"
    "&Signature=S3CRsig&x-amz-security-token=S3CRtok&response-content-type=video%2Fmp4",
    # docs.aws.amazon.com/AmazonS3/latest/API/sigv4-HTTPPOSTConstructPolicy.html (a presigned POST's form fields,
    # as a log that writes them as a query names them)
    "S3 presigned POST": "https://b.s3.amazonaws.com/?acl=private&success_action_status=201&policy=eyJleHAi"
    "&x-amz-algorithm=AWS4-HMAC-SHA256&x-amz-credential=S3CRakia%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
    "&x-amz-date=20260101T000000Z&x-amz-security-token=S3CRtok&x-amz-signature=S3CRsig&Content-Type=video%2Fmp4",
    # cloud.google.com/storage/docs/authentication/signatures (V4) and .../access-control/signed-urls-v2
    "GCS V4": "https://storage.googleapis.com/b/ds/f.mp4?X-Goog-Algorithm=GOOG4-RSA-SHA256"
    "&X-Goog-Credential=S3CRsa%40p.iam.gserviceaccount.com%2F20260101%2Fauto%2Fstorage%2Fgoog4_request"
    "&X-Goog-Date=20260101T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=S3CRsig"
    "&generation=1700000000000000",
    "GCS V2": "https://storage.googleapis.com/b/ds/f.mp4?GoogleAccessId=S3CRsa%40p.iam.gserviceaccount.com"
    "&Expires=1767225600&Signature=S3CRsig",
    # learn.microsoft.com/rest/api/storageservices/create-service-sas, create-user-delegation-sas, create-account-sas
    "Azure service SAS": "https://a.blob.core.windows.net/c/ds/f.mp4?sv=2022-11-02&st=2026-01-01T00%3A00%3A00Z"
    "&se=2026-01-02T00%3A00%3A00Z&sr=b&sp=r&sip=10.0.0.1&spr=https&si=policy1&rscd=attachment&rsct=video%2Fmp4"
    "&sig=S3CRsig",
    "Azure user delegation SAS": "https://a.blob.core.windows.net/c/ds/f.mp4?sv=2022-11-02&sr=b&sp=r"
    "&se=2026-01-02T00%3A00%3A00Z&skoid=00000000-0000-0000-0000-000000000001&sktid=00000000-0000-0000-0000-000000000002"
    "&skt=2026-01-01T00%3A00%3A00Z&ske=2026-01-02T00%3A00%3A00Z&sks=b&skv=2022-11-02&saoid=agent1&scid=corr1"
    "&sig=S3CRsig",
    "Azure account SAS": "https://a.blob.core.windows.net/c?restype=container&comp=list&marker=m1&sv=2022-11-02&ss=b"
    "&srt=sco&sp=rl&se=2026-01-02T00%3A00%3A00Z&ses=scope1&sig=S3CRsig",
    # alibabacloud.com/help/en/oss/developer-reference/ddd-signatures-to-urls (V1) and 0002-00000215.. (V4)
    "Alibaba OSS V1": "https://b.oss-cn-hangzhou.aliyuncs.com/ds/f.mp4?OSSAccessKeyId=S3CRltai&Expires=1141889120"
    "&Signature=S3CRsig&security-token=S3CRtok",
    "Alibaba OSS V4": "https://b.oss-cn-hangzhou.aliyuncs.com/ds/f.mp4?x-oss-signature-version=OSS4-HMAC-SHA256"
    "&x-oss-credential=S3CRltai%2F20221220%2Fcn-hangzhou%2Foss%2Faliyun_v4_request&x-oss-date=20221220T084818Z"
    "&x-oss-expires=3600&x-oss-additional-headers=host&x-oss-signature=S3CRsig&x-oss-security-token=S3CRtok",
    # tencentcloud.com/document/api/436/7778 (a signed URL's query, or its one url-encoded 'sign')
    "Tencent COS": "https://b-125.cos.ap-guangzhou.myqcloud.com/ds/f.mp4?q-sign-algorithm=sha1&q-ak=S3CRakid"
    "&q-sign-time=1557902800%3B1557910000&q-key-time=1557902800%3B1557910000&q-header-list=host"
    "&q-url-param-list=&q-signature=S3CRsig&x-cos-security-token=S3CRtok",
    "Tencent COS sign": "https://b-125.cos.ap-guangzhou.myqcloud.com/ds/f.mp4?sign=S3CRsig&versionId=3",
    # support.huaweicloud.com/api-obs/obs_04_0011.html
    "Huawei OBS": "https://b.obs.cn-north-4.myhuaweicloud.com/ds/f.mp4?AccessKeyId=S3CRak&Expires=1767225600"
    "&Signature=S3CRsig&x-obs-security-token=S3CRtok",
    # docs.aws.amazon.com/AmazonCloudFront/latest/DeveloperGuide/private-content-creating-signed-url-*-policy.html
    "CloudFront canned": "https://d1.cloudfront.net/ds/f.mp4?Expires=1767225600&Signature=S3CRsig"
    "&Key-Pair-Id=K2JCJMDEHXQW5F",
    "CloudFront custom": "https://d1.cloudfront.net/ds/f.mp4?Policy=eyJTdGF0ZW1lbnQiOlt7&Signature=S3CRsig"
    "&Key-Pair-Id=K2JCJMDEHXQW5F",
    # Akamai Auth Token 2.0 / EdgeAuth (token name 'hdnts' by default; '__token__' in EdgeAuth's SDKs)
    "Akamai hdnts": "https://x.akamaized.net/ds/f.mp4?hdnts=S3CRst%3D1~exp%3D2~acl%3D%2F*~hmac%3Dab&bitrate=800",
    "Akamai __token__": "https://x.akamaized.net/ds/f.mp4?__token__=S3CRexp%3D2~acl%3D%2F*~hmac%3Dab",
    # documents.cdnetworks.com (mode E), Alibaba/Tencent/BytePlus CDN type A: 'auth_key=<time>-<rand>-<uid>-<md5>'
    "CDN type A": "https://cdn.example.com/ds/f.mp4?auth_key=S3CR1715916795-7asd-0-2a593&rate=1",
    # huggingface.co: a token in the query; its resolve redirects are S3 or CloudFront signed URLs (above)
    "Hugging Face": "https://huggingface.co/datasets/o/d/resolve/main/f.mp4?token=S3CRhf&download=true",
    # backblaze.com/apidocs/b2-download-file-by-name (an authorization token as the 'Authorization' parameter)
    "Backblaze B2": "https://f345.backblazeb2.com/file/b/ds/f.mp4?Authorization=S3CRtok&b2ContentDisposition=inline",
    # generic API keys and OAuth 2.0 bearer tokens in a query (RFC 6750 section 2.3) or an implicit grant's fragment
    # (RFC 6749 section 4.2.2: the fragment is never sent, but a text names it)
    "generic query": "https://api.example.com/v1/f?access_token=S3CRat&api_key=S3CRak&apikey=S3CRak2&key=S3CRgk"
    "&page_token=p2&continuation-token=c1&nextPageToken=n3&per_page=50",
    "OAuth fragment": "https://app.example.com/cb#access_token=S3CRat&token_type=Bearer&expires_in=3600&state=xyz",
}


def _measured(url: str) -> tuple[list[str], list[str]]:
    """The parameters of ``url`` (its query's and its fragment's) whose credentials :func:`masked` shows, and those
    that are none that it masks."""
    shown = masked(url)
    parts, said = urlsplit(url), urlsplit(shown)
    pairs = [p.split("=", 1) for p in f"{parts.query}&{parts.fragment}".split("&") if "=" in p]
    kept = {p.split("=", 1)[0]: p.split("=", 1)[1] for p in f"{said.query}&{said.fragment}".split("&") if "=" in p}
    leaked = [name for name, value in pairs if value.startswith("S3CR") and kept.get(name) != MASK]
    hidden = [name for name, value in pairs if not value.startswith("S3CR") and value and kept.get(name) != value]
    return leaked, hidden


def test_every_signed_url_formats_credentials_are_masked_and_its_other_fields_shown() -> None:
    """Measured on the 22 formats above (41 credentials, 77 other fields): 4 credentials were shown in text (GCS V2's
    ``GoogleAccessId``, COS's ``q-ak``, Akamai's ``hdnts``, an OAuth fragment's ``access_token``) and 2 fields masked
    (COS's ``q-sign-time`` and ``q-key-time``, dates); 0 and 0 now. Names that tell of a credential stay shown: a
    key's name (``authKeyName=opds``), a token's id, as a key's is."""
    from lerobot_dali.url_secrets import is_secret_param

    leaked, hidden = {}, {}
    for name, url in FORMATS.items():
        leaked[name], hidden[name] = _measured(url)
    assert {name: names for name, names in leaked.items() if names} == {}
    assert {name: names for name, names in hidden.items() if names} == {}
    assert [n for n in ("authKeyName", "token_id", "tokenId", "key_id", "Key-Pair-Id") if is_secret_param(n)] == []


def test_a_signed_urls_description_drops_its_credentials_and_the_fields_signed_with_them() -> None:
    """A description (saved in every stream state) kept Akamai's ``hdnts`` and COS's ``q-ak`` (2 credentials of the
    22 formats), and the fields of OSS V4's and COS's signatures that change each time a URL is signed again
    (``x-oss-date``, ``x-oss-expires``..., ``q-sign-algorithm``...: 7), so a dataset was named anew each time, as S3's
    and GCS's were not: none kept now. (An OAuth fragment is no dataset's: left as it is.)"""
    from lerobot_dali.url_secrets import without_credentials

    described = {name: without_credentials(url) for name, url in FORMATS.items() if name != "OAuth fragment"}
    assert {name: said for name, said in described.items() if "S3CR" in said} == {}
    kept = {name: urlsplit(said).query for name, said in described.items() if urlsplit(said).query}
    assert kept == {
        "S3 SigV4 query": "x-id=GetObject&versionId=3",
        "S3 SigV2 query": "response-content-type=video%2Fmp4",
        "S3 presigned POST": "acl=private&success_action_status=201&Content-Type=video%2Fmp4",
        "GCS V4": "generation=1700000000000000",
        "Azure account SAS": "restype=container&comp=list&marker=m1",
        "Tencent COS sign": "versionId=3",
        "Akamai hdnts": "bitrate=800",
        "CDN type A": "rate=1",
        "Hugging Face": "download=true",
        "Backblaze B2": "b2ContentDisposition=inline",
        "generic query": "page_token=p2&continuation-token=c1&nextPageToken=n3&per_page=50",
    }


def test_the_credentials_a_urls_user_part_carries_are_masked() -> None:
    """A URL's ``user:password@`` in 12 spellings (any scheme's password, an http(s) URL's token given as its user):
    a token given as the user with an empty password (``https://TOKEN:@host``, as curl's ``-u TOKEN:`` gives it) was
    shown (1 of 12); 0 now. A user with a password stays shown, as an e-mail address's and an '@' in a query do."""
    said = [
        "https://user:S3CRp@h/ds", "https://S3CRtok@h/ds", "https://:S3CRp@h/ds", "https://u:S3CRp@ss@h/ds?a=1",
        "HTTP://u:S3CRp@h", "s3://AKIA:S3CRsk@b/ds", "ftp://u:S3CRp@h/x", "https://u%40x:S3CRp@h/",
        "https://S3CRtok:@h/ds", "url='https://u:S3CRp@h/ds'", "<https://u:S3CRp@h/ds>", "https://u:S3CRp@[::1]:8/ds",
    ]  # fmt: skip
    assert [text for text in said if "S3CR" in masked(text)] == []
    assert masked("https://S3CRtok:@h/ds") == "https://***@h/ds"
    kept = "https://h?mail=a:@b.org, alice@example.com, sftp://alice@host/ds, https://u:***@h"
    assert masked(kept) == kept
    # (Bunny CDN's token in a path segment stays shown: a path's 'name=value' is a Hive partition's too, and
    # masked_key would make two partitions' files one key; the path its token is for is none.)
    bunny = "https://z.b-cdn.net/bcdn_token=S3CRt&expires=1&token_path=%2Fds%2F/f.mp4"
    assert masked(bunny) == bunny


def test_the_credentials_known_formats_carry_in_a_path_or_a_user_are_masked() -> None:
    """Formats whose credential is in a URL's path or user, where no query parameter's or password's rule found it: a
    Telegram bot's token (``api.telegram.org/bot<id>:<token>/...``, its files' URLs too), a Java servlet's session as
    a path parameter (``;jsessionid=``), a GitHub token as the user of ``:x-oauth-basic@`` (the password masked, the
    token shown), PHP's session in a query (``PHPSESSID``): 5 of 5 shown -> 0. Each format's own: the bot's id, a
    path's other ``name=value`` segments and the query's other fields stay as they were."""
    said = {
        "https://api.telegram.org/bot123456:S3CR-tok_en/getUpdates?offset=4":
            "https://api.telegram.org/bot123456:***/getUpdates?offset=4",
        "url='https://api.telegram.org/file/bot123456:S3CRtok/videos/file_1.mp4'":
            "url='https://api.telegram.org/file/bot123456:***/videos/file_1.mp4'",
        "https://h/app/ds/f.mp4;jsessionid=S3CR0A.node1?rev=2": "https://h/app/ds/f.mp4;jsessionid=***?rev=2",
        "https://ghp_S3CRtok:x-oauth-basic@github.com/o/r.git": "https://***:***@github.com/o/r.git",
        "https://h/a.php?PHPSESSID=S3CRid&page=2": "https://h/a.php?PHPSESSID=***&page=2",
    }  # fmt: skip
    assert {text: masked(text) for text in said} == said
    kept = "https://h/bot123456:abc/x, https://h/ds/session=1/f.parquet;v=2, https://api.telegram.org/getMe"
    assert masked(kept) == kept
