"""Google Cloud access tokens for Anthropic's models on Vertex AI, which take no API keys.

google-auth finds the identity by Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS
(a service account's key file, or a workload identity federation config), else the metadata server
of the Google Cloud runtime the platform runs on (GKE workload identity, Cloud Run, Compute
Engine). Its refresh blocks (it speaks HTTP through `requests`), so it runs in a worker thread,
one at a time, when there is no token yet or the one held is within google-auth's margin of its
expiry; every other request reuses the token held.
"""

import asyncio
from typing import Any

from tokenyard.backends.api import BearerTokens
from tokenyard.backends.retry import Retryable

SCOPE = "https://www.googleapis.com/auth/cloud-platform"


class GoogleTokens(BearerTokens):
    """Bearer tokens for Vertex AI, from Application Default Credentials."""

    def __init__(self) -> None:
        # imported here: google-auth and its requests transport add 0.17 s to a gateway's start
        # (measured), which only a platform serving Vertex AI should pay
        import google.auth
        import google.auth.exceptions
        import google.auth.transport.requests

        self._auth = google.auth
        self._failures = google.auth.exceptions.GoogleAuthError
        self._request = google.auth.transport.requests.Request()
        self._credentials: Any = None  # found at the first request: none at start is no error
        self._lock = asyncio.Lock()

    async def token(self) -> str:
        if self._credentials is not None and self._credentials.valid:
            return str(self._credentials.token)
        async with self._lock:  # one refresh for the requests that found the token stale
            if self._credentials is None or not self._credentials.valid:
                try:
                    await asyncio.to_thread(self._refresh)
                except self._failures as exc:  # no identity found, refused, unreachable
                    raise Retryable(f"no Google Cloud token: {exc}") from exc
        return str(self._credentials.token)

    def _refresh(self) -> None:
        if self._credentials is None:
            self._credentials, _ = self._auth.default(scopes=[SCOPE])
        self._credentials.refresh(self._request)

    async def aclose(self) -> None:
        self._request.session.close()
