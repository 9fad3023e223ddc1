"""A webhook receiver on loopback for tests: it keeps every POST (path, body, headers) and
answers 200."""

from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.loopback_server import serving


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

    with serving(Handler) as received.port:
        yield received
