"""Backend test fixtures: a real Redis server, the fake OpenAI and Anthropic servers and two fake
engine replicas (tests/gateway/fake_upstream.py), each a process on a free port."""

import json
import os
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests import SUITE_ENV
from tests.gateway.conftest import Process, RedisServer, free_port, wait_until
from tokenyard.backends.base import Upstream
from tokenyard.core.settings import Settings
from tokenyard.router.catalog import ModelEntry
from tokenyard.router.upstreams import build_upstream

HERE = Path(__file__).parent
FAKE_ENGINE = HERE.parent / "gateway" / "fake_upstream.py"
KEY_ENV = "TOKENYARD_TEST_BACKEND_KEY"


def start_server(script: Path, log: Path, *args: str) -> tuple[Process, str]:
    port = free_port()
    proc = Process([sys.executable, str(script), "--port", str(port), *args], dict(SUITE_ENV), log)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/health").status_code == 200, 20, script.name)
    return proc, url


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushall()
    yield client
    await client.aclose()


def _server(script: Path, tmp: pytest.TempPathFactory, *args: str) -> Iterator[str]:
    proc, url = start_server(script, tmp.mktemp(script.stem) / "server.log", *args)
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def openai_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(HERE / "fake_openai.py", tmp_path_factory)


@pytest.fixture(scope="session")
def azure_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(HERE / "fake_azure.py", tmp_path_factory)


@pytest.fixture(scope="session")
def vertex_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(HERE / "fake_vertex.py", tmp_path_factory)


@pytest.fixture(scope="session")
def gemini_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Google's Gemini API at both doors: AI Studio (/v1beta/models/…) and Vertex AI (/v1/…)."""
    yield from _server(HERE / "fake_gemini.py", tmp_path_factory)


# the key pair and API key the fake Bedrock knows
AWS_KEYS = {"access": "AKIDFAKEBEDROCK", "secret": "fake/secret/key", "api_key": "bedrock-api-key"}


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key pair in the environment, as AWS's credential chain reads it first."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEYS["access"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_KEYS["secret"])
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def bedrock_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    keys = ["--access-key", AWS_KEYS["access"], "--secret-key", AWS_KEYS["secret"]]
    yield from _server(
        HERE / "fake_bedrock.py", tmp_path_factory, *keys, "--api-key", AWS_KEYS["api_key"]
    )


@pytest.fixture(scope="session")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Fake Entra ID and Google token endpoints over HTTPS (azure-identity takes no other), and
    the file of the certificate authority that signed its certificate."""
    folder = tmp_path_factory.mktemp("tokens")
    ca = trustme.CA()
    served = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(folder / "ca.pem")
    served.private_key_pem.write_to_path(folder / "key.pem")
    served.cert_chain_pems[0].write_to_path(folder / "cert.pem")
    port = free_port()
    command = [sys.executable, str(HERE / "fake_tokens.py"), "--port", str(port)]
    command += ["--certfile", str(folder / "cert.pem"), "--keyfile", str(folder / "key.pem")]
    server = Process(command, dict(SUITE_ENV), folder / "server.log")
    url = f"https://127.0.0.1:{port}"
    wait_until(lambda: grants(url, folder / "ca.pem") is not None, 20, "token server")
    yield url, folder / "ca.pem"
    server.stop()


def write_service_account(folder: Path, token_uri: str) -> tuple[Path, str]:
    """A Google service account's key file as Google issues them, its token endpoint `token_uri`:
    its path and the account's email."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    email = f"gateway-{os.urandom(3).hex()}@proj.iam.gserviceaccount.com"
    info = {
        "type": "service_account",
        "project_id": "proj",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": email,
        "client_id": "1",
        "token_uri": token_uri,
    }
    path = folder / "service-account.json"
    path.write_text(json.dumps(info))
    return path, email


@pytest.fixture
def service_account(
    token_server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A service account's key file, found by Application Default Credentials; its email."""
    login, ca = token_server
    path, email = write_service_account(tmp_path, login + "/token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))  # google-auth's transport is `requests`
    return email


def grants(url: str, ca: Path) -> list[dict[str, Any]]:
    """The grants a token server saw, in order."""
    trusted = ssl.create_default_context(cafile=ca)
    return httpx.get(url + "/stats", verify=trusted).json()["grants"]


@pytest.fixture(scope="session")
def anthropic_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(HERE / "fake_anthropic.py", tmp_path_factory)


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two engine replicas serving the model `fake`."""
    started = [
        start_server(FAKE_ENGINE, tmp_path_factory.mktemp("engine") / "log", "--model", "fake")
        for _ in range(2)
    ]
    yield [url for _, url in started]
    for proc, _ in started:
        proc.stop()


def control(url: str, **body: Any) -> None:
    httpx.post(url + "/control", json=body).raise_for_status()


def stats(url: str) -> dict[str, Any]:
    return httpx.get(url + "/stats").json()


def fast_settings(**overrides: Any) -> Settings:
    """Settings with short backoffs and timeouts, so fault tests run in a few seconds."""
    values: dict[str, Any] = {
        "backend_retry_attempts": 3,
        "backend_retry_backoff_s": 0.01,
        "backend_retry_backoff_max_s": 0.05,
        "backend_connect_timeout_s": 1.0,
        "backend_first_token_timeout_s": 2.0,
        "backend_read_timeout_s": 5.0,
        "backend_breaker_failures": 100,
        "backend_breaker_min_requests": 1000,
    }
    return Settings(**{**values, **overrides})


@pytest.fixture
async def build_entry(redis: aioredis.Redis) -> AsyncIterator[Any]:
    """build_entry(entry, **settings): a catalog entry's backend, closed after the test."""
    built: list[Upstream] = []

    def build(entry: ModelEntry, **settings: Any) -> Upstream:
        upstream = build_upstream(entry, redis, fast_settings(**settings))
        built.append(upstream)
        return upstream

    yield build
    for upstream in built:
        await upstream.aclose()


@pytest.fixture
def make_upstream(build_entry: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Build a backend through the factory: make_upstream(provider, urls, **settings)."""
    monkeypatch.setenv(KEY_ENV, "sk-test-secret")

    def make(
        provider: str,
        urls: list[str],
        model_id: str = "m",
        own: dict[str, Any] | None = None,  # the catalog entry's own fields (timeouts, tries)
        **settings: Any,
    ) -> Upstream:
        entry = ModelEntry(
            id=model_id,
            provider=provider,  # type: ignore[arg-type]
            upstream_model={"openai": "gpt-4o-mini", "anthropic": "claude-3-5-haiku-latest"}.get(
                provider, ""
            ),
            base_urls=tuple(urls),
            api_key_env="" if provider == "self-hosted" else KEY_ENV,
            **(own or {}),
        )
        return build_entry(entry, **settings)

    return make
