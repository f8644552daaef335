"""A real S3-compatible server on loopback (moto's server mode), started by the tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager

import pytest

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def moto_server():
    """Yields ``http://127.0.0.1:PORT``; the server process is stopped on exit."""
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra) for a local S3")
    pytest.importorskip("flask", reason="needs moto[server] (the dev extra) for a local S3")
    port = _free_port()
    env = {**os.environ, **CREDENTIALS}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def new_bucket(endpoint: str) -> str:
    """Create a bucket; returns ``s3://NAME`` with the endpoint in the query."""
    import pyarrow.fs as pafs

    name = f"test-{uuid.uuid4().hex[:12]}"
    host = endpoint.split("://", 1)[1]
    fs = pafs.S3FileSystem(endpoint_override=host, scheme="http", access_key="testing",
                           secret_key="testing", region="us-east-1",
                           allow_bucket_creation=True)
    fs.create_dir(name)
    return name


def s3_uri(endpoint: str, bucket: str, key: str) -> str:
    host = endpoint.split("://", 1)[1]
    return f"s3://{bucket}/{key}?endpoint_override={host}&scheme=http"
