"""A small HTTP/1.1 keep-alive client for upstream calls.

httpx's connection pool scans every connection on every request (quadratic under concurrency: at 64
concurrent requests it capped the gateway near 100 req/s on two cores). Upstreams here are a handful
of known HTTP/1.1 servers, so a plain pool of asyncio streams per host does: requests with
content-length bodies, responses read by content-length, chunked encoding, or until close.
"""

import asyncio
import contextlib
import re
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

# RFC 9110: a field name is a token; a value holds no control character but tab. A CR, LF or NUL
# would let a value end the header block and smuggle a second request onto a pooled connection,
# so every header this client writes passes this check
_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")

IDLE_S = 4.0  # below the usual 5 s server keep-alive, so an idle connection is rarely stale
MAX_IDLE = 256


class HttpError(Exception):
    """The connection failed or the response was malformed."""


def header_line(name: str, value: str) -> bytes:
    """One request header, refused (ValueError) unless both parts are valid HTTP."""
    if not _NAME.fullmatch(name) or not _VALUE.fullmatch(value):
        raise ValueError(f"refusing an invalid HTTP header: {name!r}")
    return f"{name}: {value}\r\n".encode()


class _Stale(HttpError):
    """A kept-alive connection the server had already closed: nothing was processed."""


class _Conn:
    __slots__ = ("reader", "used", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.used = time.monotonic()

    def close(self) -> None:
        self.writer.close()


def _dechunk(buffer: bytes) -> tuple[bytes, bytes, bool]:
    """Split complete chunks off a chunked-encoding buffer: (their data, the rest, ended)."""
    out = []
    pos = 0
    while (eol := buffer.find(b"\r\n", pos)) >= 0:
        size = int(buffer[pos:eol].split(b";")[0], 16)
        if size == 0:
            if len(buffer) < eol + 4:  # the final CRLF (no trailers from our upstreams)
                break
            return b"".join(out), b"", True
        end = eol + 2 + size
        if len(buffer) < end + 2:
            break
        out.append(buffer[eol + 2 : end])
        pos = end + 2
    return b"".join(out), buffer[pos:], False


class HttpResponse:
    """A response whose body is read once, whole (read) or as it arrives (iter_chunks)."""

    def __init__(self, pool: "HttpPool", conn: _Conn, status: int, headers: dict[str, str]):
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        length = headers.get("content-length")
        self._length = int(length) if length is not None else None

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_chunks()])

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        reader = conn.reader
        try:
            async with asyncio.timeout(self._pool.timeout) as deadline:
                if self._chunked:
                    # decode from raw reads: one read often holds many chunks, and yielding them
                    # together saves a downstream send per chunk
                    buffer = b""
                    loop = asyncio.get_running_loop()
                    while True:
                        data = await reader.read(65536)
                        if not data:
                            raise asyncio.IncompleteReadError(buffer, None)
                        buffer += data
                        pieces, buffer, done = _dechunk(buffer)
                        if pieces:
                            deadline.reschedule(loop.time() + self._pool.timeout)
                            yield pieces
                        if done:
                            break
                elif self._length is not None:
                    if self._length:
                        yield await reader.readexactly(self._length)
                else:  # until the server closes
                    while data := await reader.read(65536):
                        yield data
                    self.close()
                    return
        except (OSError, ValueError, asyncio.IncompleteReadError, TimeoutError) as exc:
            self.close()
            raise HttpError(f"reading the response: {exc!r}") from exc
        except BaseException:  # cancelled, or the consumer stopped early: the server must see it
            self.close()
            raise
        self._conn = None
        self._pool.release(conn)

    def close(self) -> None:
        """Drop the connection (the server sees the client go away)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class HttpPool:
    def __init__(self, url: str, timeout: float, connect_timeout: float = 5.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream URL must be http://host:port: {url}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.base = parts.path.rstrip("/")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._idle: deque[_Conn] = deque()
        self._host_header = f"{self.host}:{self.port}".encode()

    def release(self, conn: _Conn) -> None:
        if len(self._idle) < MAX_IDLE:
            conn.used = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise HttpError(f"connecting to {self.host}:{self.port}: {exc!r}") from exc
        return _Conn(reader, writer)

    def _reuse(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # most recent first: least likely closed by the server
            if now - conn.used < IDLE_S and not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> HttpResponse:
        head = [
            b"%s %s%s HTTP/1.1\r\nhost: %s\r\n"
            % (method.encode(), self.base.encode(), path.encode(), self._host_header)
        ]
        head.extend(header_line(name, value) for name, value in (headers or {}).items())
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        payload = b"".join(head) + body
        conn = self._reuse()
        if conn is not None:
            try:
                return await self._exchange(conn, payload)
            except _Stale:
                pass  # retry once on a fresh connection
        return await self._exchange(await self._connect(), payload)

    async def _exchange(self, conn: _Conn, payload: bytes) -> HttpResponse:
        try:
            conn.writer.write(payload)
            async with asyncio.timeout(self.timeout):
                raw = await conn.reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
        except asyncio.IncompleteReadError as exc:
            conn.close()
            kind = _Stale if not exc.partial else HttpError
            raise kind(f"{self.host}:{self.port}: connection closed") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            conn.close()
            raise _Stale(f"{self.host}:{self.port}: {exc!r}") from exc
        except (OSError, ValueError, IndexError, TimeoutError) as exc:
            conn.close()
            raise HttpError(f"{self.host}:{self.port}: {exc!r}") from exc
        except BaseException:  # cancelled while waiting: drop the request upstream too
            conn.close()
            raise
        return HttpResponse(self, conn, status, headers)

    async def aclose(self) -> None:
        while self._idle:
            with contextlib.suppress(Exception):
                self._idle.pop().close()
