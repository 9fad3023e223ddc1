"""Admin UI fixtures: a gateway with the admin sign-in on (over the gateway tests' Redis and fake
upstream), signed-in httpx clients, and Debian's Chromium for Playwright."""

import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import (  # noqa: F401 - fixtures, by name
    Gateway,
    base_env,
    data_dir,
    redis_server,
    sql,
    start_gateway,
    team,
    upstream,
)

HERE = Path(__file__).parent
ADMIN_USER = "owner"
ADMIN_PASSWORD = "pw-" + uuid.uuid4().hex
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = HERE.parents[1] / "test-artifacts"  # git-ignored; CI keeps it
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture(scope="session")
def admin_gateway(base_env: dict[str, str], data_dir: Path) -> Iterator[Gateway]:  # noqa: F811
    env = base_env | {
        "TOKENYARD_ADMIN_USER": ADMIN_USER,
        "TOKENYARD_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "TOKENYARD_CATALOG": str(HERE / "catalog.toml"),
    }
    gw = Gateway(env, data_dir / "admin-gateway.log")
    yield gw
    gw.stop()


def csrf_of(page: httpx.Response) -> str:
    """The form token a page carries."""
    found = _CSRF.search(page.text)
    assert found, f"no CSRF token on {page.url}"
    return found.group(1)


def sign_in(url: str, user: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> httpx.Client:
    """An httpx client holding an admin session (what a browser would have after signing in)."""
    client = httpx.Client(base_url=url)
    token = csrf_of(client.get("/admin/login"))
    answer = client.post("/admin/login", data={"user": user, "password": password, "csrf": token})
    assert answer.status_code == 303, answer.text
    return client


@pytest.fixture
def admin(admin_gateway: Gateway) -> Iterator[httpx.Client]:
    client = sign_in(admin_gateway.url)
    yield client
    client.close()
