"""The local S3 server of :mod:`scripts.local_s3`, skipping (with the reason) without moto."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from scripts.local_s3 import CREDENTIALS, new_bucket, s3_server, s3_uri

__all__ = ["CREDENTIALS", "moto_server", "new_bucket", "s3_uri"]


@contextmanager
def moto_server():
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra) for a local S3")
    pytest.importorskip("flask", reason="needs moto[server] (the dev extra) for a local S3")
    with s3_server() as endpoint:
        yield endpoint
