"""A raw upstream that misbehaves on purpose, for the cache's tests (issue 25): keep-alive, TLS or cleartext,
one thread per connection, and an answer chosen by the request's path.

Every answer names the server's ``label`` and the exact request target it answers (the bytes of the
request line, unchanged), so a test sees which server and which object an answer came from.

    /crawl-data/long*      Content-Length 10, then 10 bytes and 11 more in the same write (a body over its
                           length); the connection stays open
    /crawl-data/trailing*  a good answer and, in the same write, a second answer nobody asked for ("EVIL")
    /crawl-data/idlejunk*  a good answer; 0.3 s later, on the idle connection, an answer nobody asked for
    /crawl-data/quickjunk-<ms>-*  a good answer; <ms> milliseconds later, an answer nobody asked for: it is
                           in flight when a client that reuses the connection at once writes its next request
    /crawl-data/slowcut*   as slow, but reset after 5 pieces (the body never completes)
    /crawl-data/slownolen* as slow, without Content-Length (close-delimited: never storable)
    /crawl-data/slow*      Content-Length SLOW_SIZE, sent SLOW_PIECE bytes every SLOW_GAP seconds
    anything else          200 with the label and the target (a HEAD: the head only)
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.proxy_proc import ProxyProc, start_proxy
from tests.support.upstream_proc import Certs

EVIL = b'HTTP/1.1 200 OK\r\nContent-Length: 4\r\nETag: "evil"\r\n\r\nEVIL'
SLOW_SIZE = 200_000
SLOW_PIECE = 10_000
SLOW_GAP = 0.25  # 20 pieces: the whole body takes about 5 s


def answer_body(label: str, method: str, target: str) -> bytes:
    return f"{label}|{method}|{target}".encode("latin-1")


class Misbehaving:
    """One listening socket on 127.0.0.1; ``tls`` with ``server_pem`` (the tests' upstream leaf)."""

    def __init__(self, label: str, server_pem: Path | None = None) -> None:
        self.label = label
        self.ctx: ssl.SSLContext | None = None
        if server_pem is not None:
            self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.ctx.load_cert_chain(server_pem)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port: int = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.arrivals: list[tuple[int, str, str]] = []  # (connection number, method, target)
        self.connections = 0
        self.junk_sent: set[str] = set()  # targets whose unasked answer went out (idlejunk)
        # quickjunk: seconds from the good answer's last byte handed to the kernel to the unasked answer's
        # first: the thread's sleep overruns its milliseconds on a loaded box (the GIL switches every 5 ms)
        self.junk_delay: dict[str, float] = {}
        self.junk = threading.Condition(self.lock)
        threading.Thread(target=self._accept, daemon=True).start()

    def wait_junk(self, target: str, timeout: float = 10.0) -> None:
        """Block until the unasked answer after ``target``'s was sent (a blocking call on purpose: a test
        may hold its event loop with it, so the bytes wait unread in the kernel)."""
        with self.junk:
            if not self.junk.wait_for(lambda: target in self.junk_sent, timeout):
                raise TimeoutError(f"no unasked answer after {target}")

    def count(self, target: str, method: str = "GET") -> int:
        with self.lock:
            return sum(1 for _c, m, t in self.arrivals if t == target and m == method)

    def connection_of(self, target: str, method: str = "GET") -> int:
        """The number of the connection the first request for ``target`` came on (0: none came)."""
        with self.lock:
            return next((c for c, m, t in self.arrivals if t == target and m == method), 0)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                n = self.connections
            threading.Thread(target=self._serve, args=(conn, n), daemon=True).start()

    def _serve(self, raw: socket.socket, n: int) -> None:
        raw.settimeout(60)
        try:
            s: socket.socket = self.ctx.wrap_socket(raw, server_side=True) if self.ctx else raw
            with s:
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        chunk = s.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    method, target = head.split(b" ", 2)[:2]
                    m, t = method.decode("latin-1"), target.decode("latin-1")
                    with self.lock:
                        self.arrivals.append((n, m, t))
                    self._answer(s, m, t)
        except (OSError, ssl.SSLError, ValueError):
            pass

    def _answer(self, s: socket.socket, method: str, target: str) -> None:
        body = answer_body(self.label, method, target)
        good = b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: "e1"\r\n\r\n' % len(body)
        if method != "HEAD":
            good += body
        if target.startswith("/crawl-data/long"):
            s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789" + b"EXTRA-BYTES")
        elif target.startswith("/crawl-data/trailing"):
            s.sendall(good + EVIL)
        elif target.startswith("/crawl-data/quickjunk-"):
            s.sendall(good)
            sent = time.monotonic()
            time.sleep(int(target.split("quickjunk-")[1].split("-")[0]) / 1000)
            s.sendall(EVIL)
            # read once the bytes have left: a thread the GIL holds back between its clock and its send (5 ms
            # on a loaded box) sends later than a reading taken before the send says
            with self.lock:
                self.junk_delay[target] = time.monotonic() - sent
        elif target.startswith("/crawl-data/idlejunk"):
            s.sendall(good)
            time.sleep(0.3)
            s.sendall(EVIL)
            with self.junk:
                self.junk_sent.add(target)
                self.junk.notify_all()
        elif target.startswith("/crawl-data/slow"):
            self._slow(s, target)
        else:
            s.sendall(good)

    @staticmethod
    def _slow(s: socket.socket, target: str) -> None:
        nolen = target.startswith("/crawl-data/slownolen")
        length = b"Connection: close\r\n" if nolen else b"Content-Length: %d\r\n" % SLOW_SIZE
        s.sendall(b"HTTP/1.1 200 OK\r\n" + length + b"\r\n")
        for i in range(SLOW_SIZE // SLOW_PIECE):
            if i == 5 and target.startswith("/crawl-data/slowcut"):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                raise OSError("reset on purpose")  # closing the socket with linger 0 sends the RST
            time.sleep(SLOW_GAP)
            s.sendall(b"s" * SLOW_PIECE)
        if nolen:
            raise OSError("close on purpose")  # the end of a close-delimited body

    def close(self) -> None:
        self.sock.close()


@dataclass
class Behind:
    """A proxy whose data.commoncrawl.org is a ``Misbehaving`` TLS upstream."""

    p: ProxyProc
    up: Misbehaving


@contextmanager
def behind_proxy(tmp: Path, certs: Certs, config: str) -> Iterator[Behind]:
    """A misbehaving upstream for data.commoncrawl.org and a proxy in front of it (``config`` plus the
    upstream's trust and address); both stopped at the end."""
    up = Misbehaving("tls", certs.server_pem)
    text = config + (
        f'[upstream]\nca_file = "{certs.ca_file}"\n'
        f'[upstream.resolve]\n"data.commoncrawl.org:443" = "127.0.0.1:{up.port}"\n'
    )
    p = start_proxy(tmp, None, None, text)
    try:
        yield Behind(p, up)
    finally:
        p.stop()
        up.close()
