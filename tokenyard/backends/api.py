"""The HTTP side of the commercial backends (OpenAI, Anthropic): a pooled aiohttp session per
backend, and attempts that raise `Retryable` for failures before the first byte.

aiohttp rather than httpx: measured side by side against the same upstream
(bench/gateway_overhead.py --clients, bench/RESULTS.md), aiohttp served 3-55x the requests per
second of httpx 0.28 and 2.6-5x those of httpx2. The engine replicas use the own client
(backends/http.py), faster still but plain HTTP/1.1 only; these upstreams need TLS.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from yarl import URL

from tokenyard.backends.base import UpstreamBroken
from tokenyard.backends.retry import Retryable, RetryPolicy, check_status


@dataclass(frozen=True)
class Reply:
    """A whole reply: a success, or a refusal other than 429/5xx."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Opened:
    """A 200 stream whose first bytes arrived (`first`), and the rest to come."""

    response: aiohttp.ClientResponse
    first: bytes
    rest: AsyncIterator[bytes]

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.first
        try:
            async for chunk in self.rest:
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBroken(f"{self.response.url.host}: {exc!r}") from exc

    async def aclose(self) -> None:
        # a stream read to its end gives its connection back to the pool; one abandoned midway
        # cannot be reused, so it is closed
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()


class RequestAuth(Protocol):
    """What proves each request's sender where a fixed header cannot: a bearer token that expires
    (Entra ID, Google Cloud), or a signature over the request itself (AWS Signature V4)."""

    async def headers(self, url: str, body: bytes) -> dict[str, str]: ...

    async def aclose(self) -> None: ...


class BearerTokens:
    """A RequestAuth that sends `token()` as `Authorization: Bearer`."""

    async def token(self) -> str:
        raise NotImplementedError

    async def headers(self, url: str, body: bytes) -> dict[str, str]:
        return {"authorization": f"Bearer {await self.token()}"}

    async def aclose(self) -> None:
        return None


class ApiClient:
    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        policy: RetryPolicy,
        max_connections: int,
        auth: RequestAuth | None = None,
    ) -> None:
        self.policy = policy
        self._auth = auth
        self._base = base_url.rstrip("/")
        self._headers = {**headers, "content-type": "application/json"}
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=policy.connect_timeout_s, sock_read=policy.read_timeout_s
        )
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # made on first use: a session belongs to the event loop it was made in, and backends are
        # built before the app's loop runs
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                auto_decompress=True,
            )
        return self._session

    async def _post(
        self, path: str, body: bytes, content_type: str | None = None
    ) -> aiohttp.ClientResponse:
        """The request sent, with its per-request auth (a token, a signature) where it has one;
        JSON unless its `content_type` says otherwise (a multipart form)."""
        url = self._base + path
        headers = await self._auth.headers(url, body) if self._auth else {}
        if content_type is not None:
            headers["content-type"] = content_type
        # sent as written: yarl would otherwise decode a path's %3A (Bedrock's model ids hold
        # ':'), and a request signed over one path would go out with another
        return await self._client().post(URL(url, encoded=True), data=body, headers=headers)

    async def post(self, path: str, body: bytes, content_type: str | None = None) -> Reply:
        """A whole reply; a refusal other than 429/5xx is returned as it is."""
        try:
            async with await self._post(path, body, content_type) as response:
                reply = Reply(response.status, response.headers, await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Retryable(f"{type(exc).__name__}: {exc}") from exc
        check_status(reply.status, reply.headers)
        return reply

    async def open(self, path: str, body: bytes, content_type: str | None = None) -> Opened | Reply:
        """A stream up to its first bytes, within the first-token timeout; a refusal other than
        429/5xx comes back whole."""
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(self.policy.first_token_timeout_s):
                response = await self._post(path, body, content_type)
                if response.status != 200:
                    reply = Reply(response.status, response.headers, await response.read())
                    response.release()
                    check_status(reply.status, reply.headers)
                    return reply
                rest = response.content.iter_any()
                first = await anext(rest, b"")
        except TimeoutError as exc:
            if response is not None:
                response.close()
            raise Retryable("first-token timeout") from exc
        except aiohttp.ClientError as exc:
            if response is not None:
                response.close()
            raise Retryable(f"{type(exc).__name__}: {exc}") from exc
        return Opened(response, first, rest)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._auth is not None:
            await self._auth.aclose()
