"""`tokenyard gateway`, `tokenyard teams …`, `tokenyard keys …` and `tokenyard up`."""

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import SecretStr

from core.settings import Settings, get_settings
from tenancy.limits import LIMIT_FIELDS, LIMIT_HELP

DEMO_TEAM = "demo"
_T = TypeVar("_T")


def _sql(settings: Settings) -> Any:
    from core.db import database_url, get_engine

    return get_engine(database_url(settings))


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    return {
        field: getattr(args, field) for field in LIMIT_FIELDS if getattr(args, field) is not None
    }


def _print_teams(teams: list[Any], as_json: bool) -> None:
    from tenancy.teams import team_record

    records = [team_record(t) for t in teams]
    if as_json:
        print(json.dumps(records, indent=2))
        return
    for record in records:
        name = record.pop("name")
        print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in record.items()))


def _change(settings: Settings, work: Callable[[Any], Awaitable[_T]]) -> _T:
    """A change through tenancy's service, as the admin API and UI make it: the gateways' cached
    lookups of the keys it concerns are dropped from Redis (best effort), so it applies now."""
    from gateway.store import connect, embedded_redis, redis_url
    from tenancy.service import Tenancy

    async def run() -> _T:
        embedded = None if settings.redis_url else embedded_redis(settings.data_dir)
        redis = connect(redis_url(settings, embedded))
        try:
            return await work(Tenancy(_sql(settings), redis))
        finally:
            await redis.aclose()

    return asyncio.run(run())


def _teams(args: argparse.Namespace) -> int:
    from tenancy import teams
    from tenancy.errors import ManagementError

    settings = get_settings()
    name = getattr(args, "name", "")  # "list" has none
    try:
        if args.action == "create":
            team = teams.create_team(_sql(settings), name, **_limits(args))
            _print_teams([team], args.json)
        elif args.action == "update":
            limits = _limits(args)
            _print_teams([_change(settings, lambda t: t.update_team(name, **limits))], args.json)
        elif args.action == "show":
            team = teams.get_team(_sql(settings), name)
            if team is None:
                raise ManagementError(f"no team {name!r}")
            _print_teams([team], args.json)
        elif args.action == "delete":
            _change(settings, lambda t: t.delete_team(name))
            print(f"deleted team {name} and its keys (its usage records are kept)")
        elif args.action in ("disable", "enable"):
            disabled = args.action == "disable"
            _print_teams([_change(settings, lambda t: t.set_disabled(name, disabled))], args.json)
        else:
            _print_teams(teams.list_teams(_sql(settings)), args.json)
    except (ManagementError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _keys(args: argparse.Namespace) -> int:
    from tenancy import keys
    from tenancy.errors import ManagementError

    settings = get_settings()
    try:
        if args.action == "create":
            new = keys.create_key(_sql(settings), args.team)
            print(f"key for team {new.team} (prefix {new.prefix}); shown once:")
            print(new.key)
        elif args.action == "list":
            _print_keys(keys.list_keys(_sql(settings), args.team), args.json)
        elif args.action == "rotate":
            new = _change(settings, lambda t: t.rotate_key(args.prefix))
            print(f"revoked {args.prefix}; new key for team {new.team} (prefix {new.prefix}),")
            print("shown once:")
            print(new.key)
        else:
            _change(settings, lambda t: t.revoke_key(args.prefix))
            print(f"revoked {args.prefix}")
    except ManagementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _print_keys(found: list[Any], as_json: bool) -> None:
    """Prefixes, teams, state and times: never a hash or a secret."""
    records = [k.record() for k in found]
    if as_json:
        print(json.dumps(records, indent=2))
        return
    for r in records:
        state = "revoked" if r["revoked"] else "active"
        print(f"{r['prefix']}  {r['team']}  {state}  created {r['created_at']}")


def serve(settings: Settings, host: str, port: int) -> None:
    import uvicorn

    from gateway.access_log import AccessLog
    from tokenyard.app import create_app

    app = create_app(settings)
    # the gateway's own access log (gateway/access_log.py) in place of uvicorn's, which knows no
    # request id, team or tokens
    uvicorn.run(
        AccessLog(app) if settings.gateway_access_log else app,
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
    from tenancy import keys, teams

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


def _up(args: argparse.Namespace) -> int:
    """Embedded Redis + SQLite + one engine + the embeddings server + one gateway here."""
    from gateway.store import embedded_redis

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
        key = _demo_key(_sql(settings), Path(settings.data_dir))
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
    return next(
        m.id for m in models if m.provider == "self-hosted" and m.kind == "chat" and m.configured
    )


def _listen_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host", default=None, help="address to listen on (default: TOKENYARD_GATEWAY_HOST)"
    )
    p.add_argument(
        "--port", type=int, default=None, help="port to listen on (default: TOKENYARD_GATEWAY_PORT)"
    )


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON, for scripts")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("gateway", help="run the OpenAI-compatible gateway")
    _listen_flags(p)
    p.set_defaults(run=_gateway)

    teams = sub.add_parser(
        "teams", help="create, update, show, list, disable, enable or delete teams"
    )
    tsub = teams.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, what in (("create", "a new team"), ("update", "a team's limits")):
        t = tsub.add_parser(action, help=what)
        t.add_argument("name", help="the team's name (letters, digits, . _ -)")
        for field, kind in LIMIT_FIELDS.items():
            flag = "--" + field.replace("_", "-")
            t.add_argument(flag, dest=field, type=kind, default=None, help=LIMIT_HELP[field])
        _json_flag(t)
    show = tsub.add_parser("show", help="one team's limits")
    show.add_argument("name")
    _json_flag(show)
    _json_flag(tsub.add_parser("list", help="every team and its limits"))
    tsub.add_parser(
        "delete", help="delete a team and its keys (usage records are kept)"
    ).add_argument("name")
    for action, what in (
        ("disable", "refuse a team's keys until it is enabled again (all else is kept)"),
        ("enable", "let a disabled team's keys work again"),
    ):
        toggle = tsub.add_parser(action, help=what)
        toggle.add_argument("name")
        _json_flag(toggle)
    teams.set_defaults(run=_teams)

    keys_p = sub.add_parser("keys", help="create, list, revoke or rotate API keys")
    ksub = keys_p.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = ksub.add_parser("create", help="a new key for a team, printed once")
    create.add_argument("--team", required=True, help="the team the key belongs to")
    listing = ksub.add_parser("list", help="keys by prefix, team and state (never the secret)")
    listing.add_argument("--team", default=None, help="only this team's keys (default: all)")
    _json_flag(listing)
    ksub.add_parser("revoke", help="stop a key within a second").add_argument(
        "prefix", help="the key's visible prefix, as keys list shows it"
    )
    ksub.add_parser(
        "rotate", help="revoke a key and print a new one for its team (once)"
    ).add_argument("prefix", help="the key's visible prefix, as keys list shows it")
    keys_p.set_defaults(run=_keys)

    up = sub.add_parser("up", help="start Redis, SQLite, an engine and the gateway on this machine")
    _listen_flags(up)
    up.add_argument(
        "--engine-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for the engine and the embeddings server to load (default: 900)",
    )
    up.set_defaults(run=_up)
