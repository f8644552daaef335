"""A local S3-compatible server on loopback (moto's server mode): a test fixture, which
``scripts/bench_remote.py`` borrows (run from the checkout, ``tests`` imports as a package).

    python -m tests.helpers_s3_server     # serves until Ctrl-C, prints its endpoint

No pytest here, so a benchmark can import it; :mod:`tests.helpers_s3` adds the skip
when moto is missing.

Needs ``moto[server]`` (in the ``dev`` extra). Credentials are the fixed test
ones in :data:`CREDENTIALS`; nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager

__all__ = ["CREDENTIALS", "new_bucket", "s3_server", "s3_uri"]

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def s3_server(start_timeout: float = 30.0):
    """Yields ``http://127.0.0.1:PORT``; the server process is stopped on exit.

    Raises:
        ImportError: moto's server is not installed.
        RuntimeError: it did not start within ``start_timeout`` seconds.
    """
    import moto.server  # noqa: F401  (fail here, with the import error, not in a child)

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **CREDENTIALS})
    try:
        deadline = time.monotonic() + start_timeout
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
    """Create a uniquely named bucket on the server at ``endpoint``; returns its name."""
    import pyarrow.fs as pafs

    name = f"test-{uuid.uuid4().hex[:12]}"
    fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://", 1)[1], scheme="http",
                           access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                           secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                           region=CREDENTIALS["AWS_DEFAULT_REGION"], allow_bucket_creation=True)
    fs.create_dir(name)
    return name


def s3_uri(endpoint: str, bucket: str, key: str) -> str:
    """``s3://bucket/key`` with the local endpoint in the query (pyarrow reads it there)."""
    return f"s3://{bucket}/{key}?endpoint_override={endpoint.split('://', 1)[1]}&scheme=http"


def main() -> int:
    with s3_server() as endpoint:
        print(f"S3 at {endpoint} (keys: {CREDENTIALS['AWS_ACCESS_KEY_ID']}/"
              f"{CREDENTIALS['AWS_SECRET_ACCESS_KEY']}); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
