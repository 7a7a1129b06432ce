"""A real S3-compatible server on loopback (moto's server mode) that injects latency and faults.

For the object-storage tests (``tests/io/test_object_storage.py``) and the benchmark
(``benchmarks/object_storage.py``); needs the ``s3`` extra (``pip install 'zephon_columnar[s3]'``).

Every request to the bucket API is answered by moto after ``latency_s``; a seeded share
``fault_share`` of them gets a fault instead, of the kind injected least so far (and every
request for a key in ``failing_keys`` a 500):

- ``"500"``: HTTP 500 ``InternalError``; ``"503"``: HTTP 503 ``SlowDown``;
- ``"reset"``: the connection is dropped before any response;
- ``"truncate"``: the response starts (full ``Content-Length``) and the connection drops half way
  (GETs only).

``bytes_per_s`` (None: as fast as it goes) paces the bodies of object GETs, so a download can be
caught (or killed) half way.

Uploads (``PUT``) never fail. ``stats()`` counts requests, faults and the object bytes served
per key (listings not included).
In another process, ``python -m tests.s3_server --latency-ms 20`` prints the endpoint and serves
until killed.

Example:
    >>> server = FaultyS3Server(latency_s=0.02).start()  # doctest: +SKIP
    >>> fsspec.config.conf["s3"] = {"endpoint_url": server.endpoint}  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import socket
import struct
import threading
import time
from collections import Counter
from typing import Any, Iterable

FAULTS = ("500", "503", "reset", "truncate")
# moto needs some credentials; they are not checked.
TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class FaultyS3Server:
    def __init__(self, *, latency_s: float = 0.0, fault_share: float = 0.0, faults: Iterable[str] = FAULTS,
                 failing_keys: Iterable[str] = (), seed: int = 0, host: str = "127.0.0.1", port: int = 0,
                 bytes_per_s: float | None = None) -> None:
        self._lock = threading.Lock()
        self._host, self._port = host, port
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.bytes_per_s: float | None = None
        self.configure(latency_s=latency_s, fault_share=fault_share, faults=faults,
                       failing_keys=failing_keys, seed=seed, bytes_per_s=bytes_per_s)
        self.reset_stats()

    # ------------------------------------------------------------ control
    def configure(self, *, latency_s: float | None = None, fault_share: float | None = None,
                  faults: Iterable[str] | None = None, failing_keys: Iterable[str] | None = None,
                  seed: int | None = None, bytes_per_s: float | None = None) -> None:
        """Change the injected latency and faults (None: keep); ``seed`` restarts the fault draw;
        ``bytes_per_s`` paces object GET bodies (0: no pacing)."""
        with self._lock:
            if bytes_per_s is not None:
                self.bytes_per_s = float(bytes_per_s) or None
            if latency_s is not None:
                self.latency_s = float(latency_s)
            if fault_share is not None:
                self.fault_share = float(fault_share)
            if faults is not None:
                self.faults = tuple(faults)
                unknown = set(self.faults) - set(FAULTS)
                if unknown:
                    raise ValueError(f"unknown fault(s) {sorted(unknown)}; choose from {FAULTS}")
            if failing_keys is not None:
                self.failing_keys = frozenset(failing_keys)
            if seed is not None:
                self._draw = random.Random(seed)

    def reset_stats(self) -> None:
        with self._lock:
            self._requests: Counter = Counter()  # (method, key) -> requests answered or faulted
            self._bytes: Counter = Counter()  # key -> body bytes of the object sent by GETs
            self._ranged: Counter = Counter()  # key -> GETs of a byte range (footer reads, resumes)
            self._faults: Counter = Counter()  # fault -> times injected

    def stats(self) -> dict[str, Any]:
        """``{"requests": {"GET bucket/key": n, ...}, "bytes": {"bucket/key": n}, "ranged": {"bucket/key": n},
        "faults": {...}}``: ``ranged`` counts the GETs (in ``requests``) that asked for a byte range."""
        with self._lock:
            return {"requests": {f"{m} {k}": n for (m, k), n in self._requests.items()},
                    "bytes": dict(self._bytes), "ranged": dict(self._ranged), "faults": dict(self._faults)}

    # ------------------------------------------------------------ lifecycle
    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FaultyS3Server":
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.CRITICAL)  # injected faults log tracebacks
        for name, value in TEST_CREDENTIALS.items():
            os.environ.setdefault(name, value)
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(self._host, self._port, self._wrap(app), threaded=True,
                                   request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="faulty-s3", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> "FaultyS3Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------ the WSGI middleware
    def _wrap(self, app: Any) -> Any:
        def handle(environ: dict, start_response: Any) -> Iterable[bytes]:
            path, method = environ.get("PATH_INFO", "/"), environ["REQUEST_METHOD"]
            key = path.lstrip("/")
            with self._lock:
                latency, rate = self.latency_s, self.bytes_per_s
                fault = None
                if method != "PUT":
                    if key in self.failing_keys:
                        fault = "500"
                    elif self.fault_share and self._draw.random() < self.fault_share:
                        # The kind injected least so far (truncation needs a GET): every kind soon.
                        kinds = [f for f in self.faults if method == "GET" or f != "truncate"]
                        fault = min(kinds, key=lambda f: self._faults[f]) if kinds else None
                self._requests[(method, key)] += 1
                if method == "GET" and environ.get("HTTP_RANGE"):
                    self._ranged[key] += 1
                if fault is not None:
                    self._faults[fault] += 1
            if latency:
                time.sleep(latency)
            if fault in ("500", "503"):
                return _error(start_response, int(fault), method)
            if fault == "reset":
                _drop(environ)
                start_response("500 Dropped", [("Content-Length", "0")])
                return []
            body = b"".join(app(environ, start_response))
            if fault == "truncate":
                return self._truncated(key, body)
            if method == "GET" and _is_object(key):
                if rate:
                    return self._paced(key, body, rate)
                with self._lock:
                    self._bytes[key] += len(body)
            return [body]

        return handle

    def _paced(self, key: str, body: bytes, rate: float) -> Iterable[bytes]:
        piece = 8 << 10
        for start in range(0, len(body), piece):
            chunk = body[start:start + piece]
            with self._lock:
                self._bytes[key] += len(chunk)
            yield chunk
            time.sleep(len(chunk) / rate)

    def _truncated(self, key: str, body: bytes) -> Iterable[bytes]:
        half = body[: len(body) // 2]
        if _is_object(key):
            with self._lock:
                self._bytes[key] += len(half)
        yield half
        # An exception after the headers makes werkzeug drop the connection mid-body.
        raise ConnectionResetError("injected: connection dropped mid-body")

def _is_object(key: str) -> bool:
    """``bucket/key`` rather than a bucket (a listing)."""
    return "/" in key.strip("/")


def _error(start_response: Any, code: int, method: str) -> list[bytes]:
    name = {500: "InternalError", 503: "SlowDown"}[code]
    body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{name}</Code>'
            f"<Message>injected {code}</Message></Error>").encode()
    if method == "HEAD":  # a HEAD answer has no body
        body = b""
    start_response(f"{code} {name}", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body]


def _drop(environ: dict) -> None:
    """Close the client's connection before any response (an abortive close: RST)."""
    sock = environ.get("werkzeug.socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def upload_dir(fs: Any, local_dir: str, url: str) -> list[str]:
    """Put every file of ``local_dir`` under ``url`` (``s3://bucket/prefix``); the keys, sorted."""
    keys = []
    for name in sorted(os.listdir(local_dir)):
        src = os.path.join(local_dir, name)
        if os.path.isfile(src):
            dst = url.rstrip("/") + "/" + name
            fs.put_file(src, dst)
            keys.append(dst[len("s3://"):])
    return keys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--fault-share", type=float, default=0.0)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    server = FaultyS3Server(latency_s=a.latency_ms / 1000, fault_share=a.fault_share, port=a.port).start()
    print(server.endpoint, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
