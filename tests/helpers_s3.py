"""The local S3 server of :mod:`tests.helpers_s3_server`, skipping (with the reason) without moto."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from tests.helpers_s3_server import CREDENTIALS, new_bucket, s3_server, s3_uri

__all__ = ["CREDENTIALS", "moto_server", "new_bucket", "s3_endpoint", "s3_uri"]


@contextmanager
def moto_server():
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra) for a local S3")
    pytest.importorskip("flask", reason="needs moto[server] (the dev extra) for a local S3")
    with s3_server() as endpoint:
        yield endpoint


@contextmanager
def s3_endpoint():
    """The local S3 server's URL, with its credentials in the environment meanwhile
    (what a module-scoped ``endpoint`` fixture yields)."""
    import os

    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        with moto_server() as url:
            yield url
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class DroppingProxy:
    """A TCP proxy on loopback in front of the S3 server that, while armed, resets
    connections once ``after`` bytes of a response have gone through (a network
    failure mid-download, for real: the client sees a reset socket)."""

    def __init__(self, endpoint: str, after: int = 64 << 10) -> None:
        import socket
        import threading

        self.target = ("127.0.0.1", int(endpoint.rsplit(":", 1)[1]))
        self.after = after
        self.armed = 0  # connections still to drop
        self.dropped = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src, dst, response: bool) -> None:
        import socket
        import struct

        sent = 0
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                sent += len(data)
                if response and sent >= self.after:
                    with self._lock:
                        drop = self.armed > 0
                        if drop:
                            self.armed -= 1
                            self.dropped += 1
                    if drop:
                        # SO_LINGER 0: close sends a reset, not a clean end of stream.
                        dst.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
                        # Wake the thread blocked reading the client first: while its
                        # recv holds the socket, close() would send nothing at all.
                        dst.shutdown(socket.SHUT_RD)
                        break
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()
