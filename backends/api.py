"""The HTTP side of the commercial backends (OpenAI, Anthropic): a pooled httpx client per
backend, and attempts that raise `Retryable` for failures before the first byte."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from backends.base import UpstreamBroken
from backends.retry import Retryable, RetryPolicy, check_status


@dataclass
class Opened:
    """A 200 stream whose first bytes arrived (`first`), and the rest to come."""

    response: httpx.Response
    first: bytes
    rest: AsyncIterator[bytes]

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.first
        try:
            async for chunk in self.rest:
                yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamBroken(f"{self.response.url.host}: {exc!r}") from exc

    async def aclose(self) -> None:
        await self.response.aclose()


class ApiClient:
    def __init__(
        self, base_url: str, headers: dict[str, str], policy: RetryPolicy, max_connections: int
    ) -> None:
        self.policy = policy
        timeout = httpx.Timeout(
            connect=policy.connect_timeout_s,
            read=policy.read_timeout_s,
            write=policy.read_timeout_s,
            pool=policy.connect_timeout_s,
        )
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={**headers, "content-type": "application/json"},
            timeout=timeout,
            limits=limits,
        )

    async def post(self, path: str, body: bytes) -> httpx.Response:
        """A whole reply; a refusal other than 429/5xx is returned as it is."""
        try:
            response = await self._client.post(path, content=body)
        except httpx.TransportError as exc:
            raise Retryable(f"{type(exc).__name__}: {exc}") from exc
        check_status(response.status_code, response.headers)
        return response

    async def open(self, path: str, body: bytes) -> Opened | httpx.Response:
        """A stream up to its first bytes, within the first-token timeout; a refusal other than
        429/5xx comes back whole (an httpx.Response, read)."""
        request = self._client.build_request("POST", path, content=body)
        response: httpx.Response | None = None
        try:
            async with asyncio.timeout(self.policy.first_token_timeout_s):
                response = await self._client.send(request, stream=True)
                if response.status_code != 200:
                    await response.aread()
                    await response.aclose()
                    check_status(response.status_code, response.headers)
                    return response
                rest = response.aiter_bytes()
                first = await anext(rest, b"")
        except TimeoutError as exc:
            if response is not None:
                await response.aclose()
            raise Retryable("first-token timeout") from exc
        except httpx.TransportError as exc:
            if response is not None:
                await response.aclose()
            raise Retryable(f"{type(exc).__name__}: {exc}") from exc
        return Opened(response, first, rest)

    async def aclose(self) -> None:
        await self._client.aclose()
