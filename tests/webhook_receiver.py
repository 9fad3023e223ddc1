"""A webhook receiver on loopback for tests: it keeps every POST (path, body, headers) and
answers 200."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Received(list[tuple[str, bytes, dict[str, str]]]):
    port = 0


@contextmanager
def receiving() -> Iterator[Received]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            received.append((self.path, body, {k.lower(): v for k, v in self.headers.items()}))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    received.port = server.server_port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
