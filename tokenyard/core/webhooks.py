"""Webhooks the platform sends (batch callbacks, budget alerts): a JSON body POSTed, signed per the
Standard Webhooks spec, retried with backoff.

Every attempt checks the destination again (its DNS may have changed since it was given) and dials
the address it checked (core/destinations.py).
"""

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from tokenyard.core.destinations import Network, RefusedDestination, check, loggable

log = logging.getLogger("tokenyard.webhooks")


def webhook_client() -> httpx.AsyncClient:
    # no kept-alive connections: the pool keys them by the address dialled, so one could carry a
    # request for another name than the one its TLS was checked for; trust_env off: a proxy from
    # the environment would resolve the name again, and .netrc would add credentials
    return httpx.AsyncClient(
        timeout=10,
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


def _why(exc: BaseException | None) -> str:
    """An attempt's failure for the log: an HTTPStatusError's text would hold the whole URL."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__


async def deliver(
    client: httpx.AsyncClient,
    url: str,
    *,
    message_id: str,
    body: bytes,
    secret: str | None,
    allow: Sequence[Network],
    attempts: int,
    backoff_s: float,
) -> bool:
    """POST until a 2xx answers; False once `attempts` tries failed (network error or non-2xx),
    or at once when the destination is refused. `message_id` is the webhook-id of every try;
    `secret` None: unsigned (a receiver that trusts its own secret URL, as Slack's webhooks do)."""
    signer = Webhook(secret) if secret is not None else None
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=backoff_s, max=60),
            retry=retry_if_not_exception_type(RefusedDestination),
        ):
            with attempt:
                destination = await check(url, allow)
                # signed per try: receivers refuse stale timestamps (5 minutes in the spec's
                # libraries), and the tries can span longer
                now = datetime.now(UTC)
                headers = {
                    "content-type": "application/json",
                    "webhook-id": message_id,
                    "webhook-timestamp": str(int(now.timestamp())),
                }
                if signer is not None:
                    headers["webhook-signature"] = signer.sign(message_id, now, body.decode())
                reply = await destination.post(client, body, headers)
                reply.raise_for_status()
    except RefusedDestination as exc:
        log.warning("callback to %s for %s refused: %s", loggable(url), message_id, exc)
        return False
    except RetryError as exc:
        why = _why(exc.last_attempt.exception())
        log.warning("callback to %s for %s failed: %s", loggable(url), message_id, why)
        return False
    return True
