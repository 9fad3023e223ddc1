"""`tokenyard up`: the whole platform on one machine for a first look: embedded Redis, SQLite, one
engine, the embeddings server and one gateway, with a demo team whose key is printed."""

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from tokenyard.core.db import database_url, get_engine
from tokenyard.core.settings import Settings, get_settings
from tokenyard.serve import listen_flags, serve

DEMO_TEAM = "demo"


def _up(args: argparse.Namespace) -> int:
    """Embedded Redis + SQLite + one engine + the embeddings server + one gateway here."""
    from tokenyard.core.redis_client import embedded_redis

    settings = get_settings()
    servers: list[subprocess.Popen[bytes]] = []
    embedded = None
    try:
        if not settings.redis_url:
            embedded = embedded_redis(settings.data_dir)
            url = SecretStr(f"unix://{embedded.socket_file}")
            settings = settings.model_copy(update={"redis_url": url})
        if settings.engine_urls:
            print(f"using the servers at {settings.engine_urls}", flush=True)
        else:
            engine = ["engine", "--model", settings.engine_model, "--port"]
            _start(
                f"the engine ({settings.engine_model})",
                [*engine, str(settings.engine_port)],
                f"http://{settings.engine_host}:{settings.engine_port}",
                args.engine_timeout,
                servers,
            )
            embeddings = ["embeddings", "--port", str(settings.embeddings_port)]
            _start(
                "the embeddings server (all-minilm-l6-v2)",
                embeddings,
                f"http://{settings.embeddings_host}:{settings.embeddings_port}",
                args.engine_timeout,
                servers,
            )
        key = _demo_key(get_engine(database_url(settings)), Path(settings.data_dir))
        model = _demo_model(settings)
        # the dashboard should work out of the box: a fresh admin password for this run if none set
        admin_generated = not settings.admin_password
        if admin_generated:
            generated = SecretStr(secrets.token_urlsafe(12))
            settings = settings.model_copy(update={"admin_password": generated})
        host, port = args.host or settings.gateway_host, args.port or settings.gateway_port
        print(_banner(key, host, port, model, settings, admin_generated), flush=True)
        serve(settings, host, port)  # returns on Ctrl-C / SIGTERM
    finally:
        for server in servers:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                try:
                    server.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
        if embedded is not None:
            _stop_embedded(embedded)
    return 0


def _start(
    what: str, argv: list[str], url: str, timeout: float, servers: list[subprocess.Popen[bytes]]
) -> None:
    """A `tokenyard` server as a process of its own (stopped with `up`), once it answers."""
    command = [sys.executable, "-c", "from tokenyard.cli import main; main()", *argv]
    print(f"starting {what} on {url} …", flush=True)
    servers.append(subprocess.Popen(command, start_new_session=True))
    _wait_healthy(url, servers[-1], timeout)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{url} exited with status {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"{url} did not become healthy within {timeout:.0f} s")


def _demo_key(sql: Any, data_dir: Path) -> str:
    """The demo team's key: the one this data dir's last `up` made while it still works (kept in
    a file only the owner reads), else a new one. Keys are stored hashed, so the file is the only
    way to show it again."""
    from tokenyard.tenancy import keys, teams

    if teams.get_team(sql, DEMO_TEAM) is None:
        teams.create_team(sql, DEMO_TEAM, rpm=600, tpm=200_000, concurrency=16)
    saved = data_dir / "demo-key"
    if saved.exists():
        key = saved.read_text().strip()
        if keys.lookup_key(sql, keys.hash_key(key)) is not None:
            return key
    key = keys.create_key(sql, DEMO_TEAM).key
    data_dir.mkdir(parents=True, exist_ok=True)
    saved.touch(mode=0o600)
    saved.write_text(key + "\n")
    return key


def _banner(
    key: str, host: str, port: int, model: str, settings: Settings, admin_generated: bool
) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    base = f"http://{shown}:{port}/v1"
    password = (
        settings.admin_password.get_secret_value()
        if admin_generated
        else "from TOKENYARD_ADMIN_PASSWORD"
    )
    return f"""
tokenyard is up: gateway {base}, team {DEMO_TEAM!r}
API key of team {DEMO_TEAM!r} (kept in the data dir, reused by the next `up`):
{key}

admin UI: http://{shown}:{port}/admin (user {settings.admin_user!r}, password {password})

curl {base}/chat/completions \\
  -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
  -d '{{"model": "{model}", "max_tokens": 32,
       "messages": [{{"role": "user", "content": "Say hello"}}]}}'

python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{base}", api_key="{key}")
messages = [{{"role": "user", "content": "Say hello"}}]
for chunk in client.chat.completions.create(
    model="{model}", messages=messages, max_tokens=32, stream=True
):
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
PY

Ctrl-C stops everything.
"""


def _stop_embedded(embedded: Any) -> None:
    """Save and stop the embedded Redis; if it cannot save (disk, deleted dir), Redis refuses to
    stop, so stop it without saving rather than leave it running."""
    import redis

    try:
        embedded.shutdown(save=True)
    except redis.ResponseError:
        with contextlib.suppress(redis.RedisError):
            embedded.shutdown(nosave=True)
    except redis.RedisError:
        pass  # already gone


def _demo_model(settings: Settings) -> str:
    """The model the banner's examples name: the catalog's first self-hosted one with replicas."""
    from tokenyard.router.catalog import load_catalog

    models = load_catalog(settings).models.values()
    return next(
        m.id for m in models if m.provider == "self-hosted" and m.kind == "chat" and m.configured
    )


def add_parser(sub: Any) -> None:
    up = sub.add_parser("up", help="start Redis, SQLite, an engine and the gateway on this machine")
    listen_flags(up)
    up.add_argument(
        "--engine-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for the engine and the embeddings server to load (default: 900)",
    )
    up.set_defaults(run=_up)
