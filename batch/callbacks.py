"""The inline form's completion callback: POST the batch object, retried with backoff."""

import logging
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryError, stop_after_attempt, wait_exponential

log = logging.getLogger("tokenyard.batch")


async def deliver(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], attempts: int, backoff_s: float
) -> bool:
    """POST until a 2xx answers; False once `attempts` tries failed (network error or non-2xx)."""
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=backoff_s, max=60),
        ):
            with attempt:
                reply = await client.post(url, json=payload)
                reply.raise_for_status()
    except RetryError as exc:
        log.warning("callback to %s for %s failed: %s", url, payload["id"], exc.last_attempt)
        return False
    return True
