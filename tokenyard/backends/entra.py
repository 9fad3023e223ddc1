"""Microsoft Entra ID tokens for Azure OpenAI: many organisations turn keys off on their Azure
resources (`disableLocalAuth`), and their deployments take only a bearer token.

azure-identity gets and refreshes the tokens: a service principal named in the catalog (tenant,
client id, secret from the environment), or else its DefaultAzureCredential, which finds one in the
environment where the platform runs: AZURE_TENANT_ID/AZURE_CLIENT_ID with AZURE_CLIENT_SECRET or a
certificate, Kubernetes workload identity (AZURE_FEDERATED_TOKEN_FILE), a managed identity.
AZURE_AUTHORITY_HOST names a sovereign cloud's login host. A token is fetched once and reused until
a few minutes before it expires (the library's bearer-token provider caches it).
"""

import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from tokenyard.backends.api import BearerTokens
from tokenyard.backends.retry import Retryable

if TYPE_CHECKING:
    from azure.core.credentials_async import AsyncTokenCredential

SCOPE = "https://cognitiveservices.azure.com/.default"


class EntraTokens(BearerTokens):
    """Bearer tokens for Azure OpenAI, from one credential."""

    def __init__(
        self, tenant_id: str = "", client_id: str = "", client_secret_env: str = ""
    ) -> None:
        # imported here: azure-identity adds 0.1-0.2 s to a gateway's start (python -X importtime),
        # which only a platform serving Azure with Entra ID should pay
        from azure.core.exceptions import AzureError
        from azure.identity.aio import (
            ClientSecretCredential,
            DefaultAzureCredential,
            get_bearer_token_provider,
        )

        credential: AsyncTokenCredential
        if tenant_id and client_id and client_secret_env:
            secret = os.environ.get(client_secret_env, "")
            credential = ClientSecretCredential(tenant_id, client_id, secret)
        else:
            credential = DefaultAzureCredential()
        self._credential = credential
        self._failures = AzureError
        self._provider: Callable[[], Awaitable[str]] = get_bearer_token_provider(credential, SCOPE)

    async def token(self) -> str:
        try:
            return await self._provider()
        except self._failures as exc:  # no credential found, refused, the login host unreachable
            raise Retryable(f"no Entra ID token: {exc}") from exc

    async def aclose(self) -> None:
        await self._credential.close()
