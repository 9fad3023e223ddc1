"""`tokenyard gateway`, `tokenyard teams …`, `tokenyard keys …` and `tokenyard up`."""

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from typing import Any

import httpx

from gateway.limits import LIMIT_FIELDS
from tokenyard.settings import Settings, get_settings

DEMO_TEAM = "demo"


def _sql(settings: Settings) -> Any:
    from gateway.db import database_url, get_engine

    return get_engine(database_url(settings))


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    return {
        field: getattr(args, field) for field in LIMIT_FIELDS if getattr(args, field) is not None
    }


def _print_team(team: Any) -> None:
    fields = ", ".join(f"{name}={getattr(team, name)}" for name in LIMIT_FIELDS)
    print(f"{team.name}: {fields}")


def _teams(args: argparse.Namespace) -> int:
    from gateway import keys

    sql = _sql(get_settings())
    try:
        if args.action == "create":
            _print_team(keys.create_team(sql, args.name, **_limits(args)))
        elif args.action == "update":
            _print_team(keys.update_team(sql, args.name, **_limits(args)))
        else:
            for team in keys.list_teams(sql):
                _print_team(team)
    except (keys.ManagementError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _drop_cached_key(settings: Settings, key_hash: str) -> None:
    """Best effort: forget the revoked key in Redis now rather than when its entry expires."""
    import redis

    from gateway.auth import cache_key
    from gateway.store import embedded_redis

    try:
        if settings.redis_url:
            redis.Redis.from_url(settings.redis_url, socket_timeout=1.0).delete(cache_key(key_hash))
        else:
            embedded_redis(settings.data_dir).delete(cache_key(key_hash))
    except redis.RedisError:
        pass


def _keys(args: argparse.Namespace) -> int:
    from gateway import keys

    settings = get_settings()
    sql = _sql(settings)
    try:
        if args.action == "create":
            new = keys.create_key(sql, args.team)
            print(f"key for team {new.team} (prefix {new.prefix}); shown once:")
            print(new.key)
        else:
            _drop_cached_key(settings, keys.revoke_key(sql, args.prefix))
            print(f"revoked {args.prefix}")
    except keys.ManagementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def serve(settings: Settings, host: str, port: int) -> None:
    import uvicorn

    from gateway.app import create_app

    # no access log: request lines are not needed per request, and it costs per-request time
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        # SIGTERM: stop accepting, give in-flight requests and streams this long, then cancel them
        timeout_graceful_shutdown=settings.gateway_drain_s or None,
        proxy_headers=True,
        forwarded_allow_ips=settings.gateway_trusted_proxies,
    )


def _gateway(args: argparse.Namespace) -> int:
    settings = get_settings()
    serve(settings, args.host or settings.gateway_host, args.port or settings.gateway_port)
    return 0


def _wait_healthy(url: str, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the engine exited with status {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"{url} did not become healthy within {timeout:.0f} s")


def _banner(key: str, port: int, model: str, settings: Settings, admin_generated: bool) -> str:
    base = f"http://127.0.0.1:{port}/v1"
    password = settings.admin_password if admin_generated else "from TOKENYARD_ADMIN_PASSWORD"
    return f"""
tokenyard is up: gateway {base}, team {DEMO_TEAM!r}
API key (shown once):
{key}

admin UI: http://127.0.0.1:{port}/admin (user {settings.admin_user!r}, password {password})

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


def _up(args: argparse.Namespace) -> int:
    """Embedded Redis + SQLite + one engine + one gateway on this machine."""
    from gateway import keys
    from gateway.store import embedded_redis

    settings = get_settings()
    engine: subprocess.Popen[bytes] | None = None
    embedded = None
    try:
        if not settings.redis_url:
            embedded = embedded_redis(settings.data_dir)
            settings = settings.model_copy(update={"redis_url": f"unix://{embedded.socket_file}"})
        if settings.engine_urls:
            print(f"using the engine(s) at {settings.engine_urls}", flush=True)
        else:
            engine_url = f"http://{settings.engine_host}:{settings.engine_port}"
            command = [sys.executable, "-c", "from tokenyard.cli import main; main()", "engine"]
            command += ["--model", settings.engine_model, "--port", str(settings.engine_port)]
            print(f"starting the engine ({settings.engine_model}) on {engine_url} …", flush=True)
            engine = subprocess.Popen(command, start_new_session=True)
            _wait_healthy(engine_url, engine, args.engine_timeout)
        sql = _sql(settings)
        if keys.get_team(sql, DEMO_TEAM) is None:
            keys.create_team(sql, DEMO_TEAM, rpm=600, tpm=200_000, concurrency=16)
        key = keys.create_key(sql, DEMO_TEAM).key
        model = _demo_model(settings)
        # the dashboard should work out of the box: a fresh admin password for this run if none set
        admin_generated = not settings.admin_password
        if admin_generated:
            settings = settings.model_copy(update={"admin_password": secrets.token_urlsafe(12)})
        print(_banner(key, args.port, model, settings, admin_generated), flush=True)
        serve(settings, args.host, args.port)  # returns on Ctrl-C / SIGTERM
    finally:
        if engine is not None and engine.poll() is None:
            os.killpg(engine.pid, signal.SIGTERM)
            try:
                engine.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(engine.pid, signal.SIGKILL)
                engine.wait()
        if embedded is not None:
            _stop_embedded(embedded)
    return 0


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
    from router.catalog import load_catalog

    models = load_catalog(settings).models.values()
    return next(m.id for m in models if m.provider == "self-hosted" and m.configured)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("gateway", help="run the OpenAI-compatible gateway")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.set_defaults(run=_gateway)

    teams = sub.add_parser("teams", help="create, update or list teams")
    tsub = teams.add_subparsers(dest="action", required=True)
    for action in ("create", "update"):
        t = tsub.add_parser(action)
        t.add_argument("name")
        for field, kind in LIMIT_FIELDS.items():
            t.add_argument("--" + field.replace("_", "-"), dest=field, type=kind, default=None)
    tsub.add_parser("list")
    teams.set_defaults(run=_teams)

    keys_p = sub.add_parser("keys", help="create or revoke API keys")
    ksub = keys_p.add_subparsers(dest="action", required=True)
    ksub.add_parser("create").add_argument("--team", required=True)
    ksub.add_parser("revoke").add_argument("prefix")
    keys_p.set_defaults(run=_keys)

    up = sub.add_parser("up", help="start Redis, SQLite, an engine and the gateway on this machine")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--engine-timeout", type=float, default=900.0, help="seconds to wait for it")
    up.set_defaults(run=_up)
