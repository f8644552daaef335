"""Secrets in URIs: one parse for what is shown and what is opened, so a secret is
never shown (messages, logs, manifests), nor taken for a bucket or an object key.
The end-to-end case packs to a real S3 server on loopback (moto's server mode)."""

from __future__ import annotations

from urllib.parse import quote

import numpy as np
import pytest
from helpers_packer import image_folder
from helpers_s3 import CREDENTIALS, new_bucket, s3_endpoint

from formats import ShardpackError
from formats.errors import URIError
from formats.storage import display_uri, open_location, parse_uri

ENDPOINT = "endpoint_override=127.0.0.1:1&scheme=http"  # never contacted: nothing listens


def _forms(secret: str) -> set[str]:
    """How a secret could leak: raw, percent-encoded, or its longer '/'-separated parts."""
    parts = {p for p in secret.replace("@", "/").split("/") if len(p) >= 4}
    return {secret, quote(secret, safe=""), quote(secret)} | parts


# (URI, its secret, how it is shown)
SHOWN = [
    ("s3://AKID:9/SeCrEtKeY@bkt/ds", "9/SeCrEtKeY", "s3://bkt/ds"),  # digits before the "/"
    ("s3://AKID:1234/SeCr/EtKeY@bkt/ds/x", "1234/SeCr/EtKeY", "s3://bkt/ds/x"),
    ("s3://AKID:wJal/rXUt+nFEMI/K7MDENG@bkt/ds", "wJal/rXUt+nFEMI/K7MDENG", "s3://bkt/ds"),
    ("s3://AKID:SeCr@EtKeY@bkt/ds", "SeCr@EtKeY", "s3://bkt/ds"),  # "@" in the secret
    ("s3://AKID:Se/Cr@Et+KeY@bkt/dir/x.jpg", "Se/Cr@Et+KeY", "s3://bkt/dir/x.jpg"),
    ("s3://AKID:SeCr%2FEt%40KeY@bkt/ds", "SeCr/Et@KeY", "s3://bkt/ds"),  # percent-encoded
    ("s3://AKID:SeCr%2FEt%40KeY@bkt/ds", "SeCr%2FEt%40KeY", "s3://bkt/ds"),
    ("gs://AKID:9/SeCrEtKeY@bkt/ds", "9/SeCrEtKeY", "gs://bkt/ds"),
    ("hdfs://user:pass/WoRdXy@namenode/x", "pass/WoRdXy", "hdfs://namenode/x"),
    ("s3://bkt/ds?secret_key=SeCrEtKeY&access_key=AKID", "SeCrEtKeY", "s3://bkt/ds"),
    ("s3://bkt/ds?session_token=ToKeNvAlUe", "ToKeNvAlUe", "s3://bkt/ds"),
    ("s3://bkt/ds?my_password=PaSsWoRd&api_key=KeYvAlUe", "PaSsWoRd", "s3://bkt/ds"),
    ("s3://bkt/ds?SeCrEtAlOnE", "SeCrEtAlOnE", "s3://bkt/ds"),
    ("s3://AKID:SeCr?EtKeY@bkt/ds", "SeCr?EtKeY", "s3://***"),  # unescaped "?": unparseable
    ("s3://AKID:SeCrEtKeY/bkt/ds", "SeCrEtKeY", "s3://***"),  # a forgotten "@"
]


@pytest.mark.parametrize(("uri", "secret", "shown"), SHOWN)
def test_a_uri_is_shown_without_its_secret(uri, secret, shown):
    assert display_uri(uri) == shown
    try:
        parsed = parse_uri(uri)
    except URIError as exc:  # what a malformed URI's error says must not hold it either
        parsed = exc
    for form in _forms(secret):
        assert form not in display_uri(uri)
        assert form not in repr(parsed) and form not in str(parsed)


def test_names_and_ports_that_are_not_secrets_are_kept():
    assert display_uri("s3://bkt/me@home.jpg") == "s3://bkt/me@home.jpg"
    assert display_uri("hdfs://nn:8020/a/b@c") == "hdfs://nn:8020/a/b@c"
    assert display_uri("s3://bkt/a%20b+c") == "s3://bkt/a%20b+c"
    assert display_uri("/local/path@x") == "/local/path@x"


def test_the_userinfo_runs_to_the_last_at_before_the_query():
    p = parse_uri("s3://AKID:Se/Cr@Et@bkt/dir/x?region=eu-west-1")
    assert (p.user, p.password, p.authority, p.path) == ("AKID", "Se/Cr@Et", "bkt", "dir/x")
    p = parse_uri("s3://AK%3AID:SeCr%2BEt@bkt/ds")  # the standard form: every byte escaped
    assert (p.user, p.password) == ("AK:ID", "SeCr+Et")


@pytest.mark.parametrize("uri", [
    "s3://AKID:9/SeCr+EtKeY@bucket/ds?" + ENDPOINT,
    "s3://AKID:9%2FSeCr%2BEtKeY@bucket/ds?" + ENDPOINT,
    "s3://bucket/ds?access_key=AKID&secret_key=9/SeCr%2BEtKeY&" + ENDPOINT,
])
def test_the_location_takes_bucket_key_and_credentials_from_the_same_parse(uri):
    loc = open_location(uri)
    assert (loc.root, loc.uri) == ("bucket/ds", "s3://bucket/ds")
    options = loc.fs.__reduce__()[1][0]  # how pyarrow pickles the filesystem: its options
    assert (options["access_key"], options["secret_key"]) == ("AKID", "9/SeCr+EtKeY")
    assert "SeCr" not in repr(loc) and "SeCr" not in loc.uri_of("x")


def test_an_unknown_query_key_is_a_usage_error_naming_it_and_the_keys_understood():
    with pytest.raises(URIError) as exc:
        open_location("s3://bkt/ds?endpoint=127.0.0.1:9000")
    text = str(exc.value)
    assert isinstance(exc.value, ShardpackError)
    assert "'endpoint'" in text and "endpoint_override" in text and "region" in text
    with pytest.raises(URIError, match="AWS_SESSION_TOKEN") as exc:
        open_location("s3://bkt/ds?session_token=ToKeNvAlUe")
    assert "ToKeNvAlUe" not in str(exc.value)


def test_an_item_that_may_be_a_secret_is_not_named():
    with pytest.raises(URIError) as exc:
        open_location("s3://bkt/ds?SeCrEtAlOnE")
    assert "SeCrEtAlOnE" not in str(exc.value)


def test_a_bucket_holding_a_colon_is_refused_without_showing_it():
    with pytest.raises(URIError) as exc:
        open_location("s3://AKID:SeCrEtKeY/bkt/ds")
    assert "SeCrEtKeY" not in str(exc.value) and "AKID" not in str(exc.value)


def test_an_option_pyarrow_refuses_is_a_usage_error_without_the_secret():
    with pytest.raises(URIError) as exc:
        open_location("s3://AKID:9/SeCrEtKeY@bkt/ds?allow_bucket_creation=maybe")
    assert "maybe" in str(exc.value) and "SeCrEt" not in str(exc.value)


def test_fsspec_locations_take_no_credentials_in_the_uri():
    """fsspec protocols read an authority each their own way (memory:// takes it for
    part of the path): credentials there are refused, never made part of a key."""
    pytest.importorskip("fsspec")
    with pytest.raises(URIError) as exc:
        open_location("memory://AKID:Se/CrEt@host/x")
    assert "CrEt" not in str(exc.value) and "memory://host/x" in str(exc.value)
    assert open_location("memory://host/x").uri == "memory://host/x"


def test_an_unknown_scheme_is_a_typed_error_not_an_import_error():
    with pytest.raises(ShardpackError, match="zzz"):
        open_location("zzz://AKID:9/SeCrEtKeY@host/x")


# -- end to end, against a real S3 server --------------------------------------------------

@pytest.fixture(scope="module")
def endpoint():
    with s3_endpoint() as url:
        yield url


def _every_key(endpoint: str) -> list[str]:
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://", 1)[1], scheme="http",
                           access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                           secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                           region=CREDENTIALS["AWS_DEFAULT_REGION"])
    infos = fs.get_file_info(pafs.FileSelector("", recursive=True))
    return [i.path for i in infos]


def test_a_pack_to_s3_never_puts_the_secret_in_a_key_a_manifest_or_a_message(endpoint,
                                                                               tmp_path,
                                                                               monkeypatch):
    from packer import PackOptions, pack

    monkeypatch.setenv("SHARDPACK_CACHE", str(tmp_path / "cache"))
    secret = "9/SeCrEt+Key@x"  # digits before a "/", a "+" and an "@", all unescaped
    src = tmp_path / "src"
    image_folder(src, np.random.default_rng(0), per_class=3)
    bucket = new_bucket(endpoint)
    query = f"endpoint_override={endpoint.split('://', 1)[1]}&scheme=http"
    dst = f"s3://AKID:{secret}@{bucket}/ds?{query}"
    summary = pack(src, dst, PackOptions(records_per_shard=4, workers=0, durable=False))
    assert summary.complete and summary.dst == f"s3://{bucket}/ds"
    keys = _every_key(endpoint)
    assert f"{bucket}/ds/manifest.json" in keys
    leaked = [k for k in keys if any(form in k for form in _forms(secret))]
    assert not leaked, f"the secret reached object keys: {leaked}"
    manifest = open_location(dst).read_bytes("manifest.json", 1 << 20).decode()
    assert not any(form in manifest for form in _forms(secret))
    assert not any(form in repr(summary.to_json()) for form in _forms(secret))
    # A failure names the location, never the secret: a bucket that does not exist.
    missing = f"s3://AKID:{secret}@no-such-bucket-{bucket}/ds?{query}"
    with pytest.raises(ShardpackError) as exc:
        pack(src, missing, PackOptions(records_per_shard=4, workers=0, durable=False))
    assert f"no-such-bucket-{bucket}" in str(exc.value)
    assert not any(form in str(exc.value) for form in _forms(secret))
