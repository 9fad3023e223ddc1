"""AWS Signature Version 4 for Anthropic's models on Amazon Bedrock, whose requests are signed,
each over its own URL, headers, body and time.

botocore signs, and finds the credentials by AWS's own chain: AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), a profile of the shared config (AWS_PROFILE),
Kubernetes on EKS (IRSA's web identity, or Pod Identity), an ECS task's role, an EC2 instance's
role. Temporary credentials are refreshed by botocore in a worker thread (it blocks on STS or the
metadata service) when near their expiry; signing itself is an HMAC chain, ~50 us a request
(measured).
"""

import asyncio
from typing import Any

from tokenyard.backends.retry import Retryable


class AwsSigV4:
    """Signs each request for one region's Bedrock."""

    def __init__(self, region: str, service: str = "bedrock") -> None:
        # imported here: botocore adds 0.22 s to a gateway's start (measured), which only a
        # platform serving Bedrock should pay
        import botocore.auth
        import botocore.awsrequest
        import botocore.exceptions
        import botocore.session

        self._region = region
        self._service = service
        self._sign = botocore.auth.SigV4Auth
        self._request = botocore.awsrequest.AWSRequest
        self._failures = botocore.exceptions.BotoCoreError
        self._none_found = botocore.exceptions.NoCredentialsError
        self._session = botocore.session.get_session()
        self._credentials: Any = None  # found at the first request: none at start is no error
        self._lock = asyncio.Lock()

    async def headers(self, url: str, body: bytes) -> dict[str, str]:
        frozen = await self._frozen()
        request = self._request(
            "POST", url, data=body, headers={"content-type": "application/json"}
        )
        self._sign(frozen, self._service, self._region).add_auth(request)
        return {k: v for k, v in request.headers.items() if k.lower() != "content-type"}

    async def _frozen(self) -> Any:
        if not self._stale():
            return self._credentials.get_frozen_credentials()
        async with self._lock:  # one lookup or refresh for the requests that found them stale
            if self._stale():
                try:
                    self._credentials = await asyncio.to_thread(self._fresh)
                except self._failures as exc:  # none found, refused, STS unreachable
                    raise Retryable(f"no AWS credentials: {exc}") from exc
            return self._credentials.get_frozen_credentials()

    def _stale(self) -> bool:
        if self._credentials is None:
            return True
        refresh_needed = getattr(self._credentials, "refresh_needed", None)  # temporary ones only
        return bool(refresh_needed and refresh_needed())

    def _fresh(self) -> Any:
        credentials = self._credentials or self._session.get_credentials()
        if credentials is None:
            raise self._none_found()
        credentials.get_frozen_credentials()  # refreshes temporary ones here, in the thread
        return credentials

    async def aclose(self) -> None:
        return None
