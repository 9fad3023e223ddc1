"""`tokenyard teams …` and `tokenyard keys …`: reads straight from SQL, changes through the
service the admin API and UI use (tenancy/service.py)."""

import argparse
import asyncio
import getpass
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from tokenyard.core.settings import Settings, get_settings
from tokenyard.tenancy.limits import (
    KEY_LIMIT_FIELDS,
    LIMIT_FIELDS,
    LIMIT_HELP,
    model_limits_text,
    parse_model_limits,
)

_T = TypeVar("_T")


def _sql(settings: Settings) -> Any:
    from tokenyard.core.db import database_url, get_engine

    return get_engine(database_url(settings))


def _actor() -> str:
    """Who the trail of changes names for the CLI's: the operating-system user running it."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no USER variable nor passwd entry, as in some containers
        return "cli"


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    return {
        field: getattr(args, field) for field in LIMIT_FIELDS if getattr(args, field) is not None
    }


def _model_limits(text: str) -> dict[str, dict[str, int]]:
    try:
        return parse_model_limits(text)
    except ValueError as exc:  # argparse shows this one's message, not only the value
        raise argparse.ArgumentTypeError(str(exc)) from None


def _show(records: list[dict[str, Any]], as_json: bool, line: Callable[[dict], str]) -> None:
    """Records as JSON, for scripts, or one line each."""
    if as_json:
        print(json.dumps(records, indent=2))
        return
    for record in records:
        print(line(record))


def _print_teams(teams: list[Any], as_json: bool) -> None:
    from tokenyard.tenancy.teams import team_record

    def line(r: dict[str, Any]) -> str:
        return f"{r['name']}: " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "name")

    _show([team_record(t) for t in teams], as_json, line)


def _change(settings: Settings, work: Callable[[Any], Awaitable[_T]]) -> _T:
    """A change through tenancy's service, as the admin API and UI make it: the gateways' cached
    lookups of the keys it concerns are dropped from Redis (best effort), so it applies now."""
    from tokenyard.core.redis_client import connect, embedded_redis, redis_url
    from tokenyard.tenancy.service import Tenancy

    async def run() -> _T:
        embedded = None if settings.redis_url else embedded_redis(settings.data_dir)
        redis = connect(redis_url(settings, embedded))
        try:
            return await work(Tenancy(_sql(settings), redis))
        finally:
            await redis.aclose()

    return asyncio.run(run())


def _teams(args: argparse.Namespace) -> int:
    from tokenyard.tenancy import teams
    from tokenyard.tenancy.changes import list_changes
    from tokenyard.tenancy.end_users import list_blocked
    from tokenyard.tenancy.errors import ManagementError

    settings, actor = get_settings(), _actor()
    name = getattr(args, "name", "")  # "list" has none
    try:
        if args.action == "create":
            team = teams.create_team(_sql(settings), name, actor=actor, **_limits(args))
            _print_teams([team], args.json)
        elif args.action == "update":
            limits = _limits(args)
            updated = _change(settings, lambda t: t.update_team(name, actor=actor, **limits))
            _print_teams([updated], args.json)
        elif args.action == "show":
            team = teams.get_team(_sql(settings), name)
            if team is None:
                raise ManagementError(f"no team {name!r}")
            _print_teams([team], args.json)
        elif args.action == "delete":
            _change(settings, lambda t: t.delete_team(name, actor=actor))
            print(f"deleted team {name} and its keys (its usage records are kept)")
        elif args.action in ("disable", "enable"):
            disabled = args.action == "disable"
            toggled = _change(settings, lambda t: t.set_disabled(name, disabled, actor=actor))
            _print_teams([toggled], args.json)
        elif args.action == "block":
            reason = args.reason
            _change(settings, lambda t: t.block_end_user(name, args.user, reason, actor=actor))
            print(f"blocked end user {args.user!r} of team {name}")
        elif args.action == "unblock":
            _change(settings, lambda t: t.unblock_end_user(name, args.user, actor=actor))
            print(f"unblocked end user {args.user!r} of team {name}")
        elif args.action == "blocked":
            _print_blocked(list_blocked(_sql(settings), name), args.json)
        elif args.action == "changes":
            _print_changes(list_changes(_sql(settings), name or None, args.limit), args.json)
        else:
            _print_teams(teams.list_teams(_sql(settings)), args.json)
    except (ManagementError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _keys(args: argparse.Namespace) -> int:
    from tokenyard.tenancy import keys
    from tokenyard.tenancy.errors import ManagementError

    settings, actor = get_settings(), _actor()
    try:
        if args.action == "create":
            expires = _expiry(args.expires_in_days)
            models = (args.models or "").split(",")
            limits = _key_limits(args)
            new = keys.create_key(
                _sql(settings), args.team, args.name, expires, models, limits, actor=actor
            )
            until = f", expires {expires.isoformat(timespec='seconds')}" if expires else ""
            print(f"key for team {new.team} (prefix {new.prefix}{until}); shown once:")
            print(new.key)
        elif args.action == "list":
            _print_keys(keys.list_keys(_sql(settings), args.team), args.json)
        elif args.action == "update":
            changes = _key_changes(args)
            info = _change(settings, lambda t: t.update_key(args.prefix, actor=actor, **changes))
            _print_keys([info], args.json)
        elif args.action == "rotate":
            new = _change(settings, lambda t: t.rotate_key(args.prefix, actor=actor))
            print(f"revoked {args.prefix}; new key for team {new.team} (prefix {new.prefix}),")
            print("shown once:")
            print(new.key)
        else:
            _change(settings, lambda t: t.revoke_key(args.prefix, actor=actor))
            print(f"revoked {args.prefix}")
    except (ManagementError, ValueError, OverflowError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _expiry(days: float | None) -> datetime | None:
    return None if days is None else datetime.now(UTC) + timedelta(days=days)


def _key_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The settings `keys update` was given: those left out are kept."""
    changes: dict[str, Any] = {}
    if args.name is not None:
        changes["name"] = args.name or None  # "": no name
    if args.no_expiry:
        changes["expires_at"] = None
    elif args.expires_in_days is not None:
        changes["expires_at"] = _expiry(args.expires_in_days)
    if args.models is not None:
        changes["models"] = args.models.split(",")  # "": the team's
    return changes | _key_limits(args)


def _key_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The key's own limits given (0: none, only the team's)."""
    given = {name: getattr(args, name) for name in KEY_LIMIT_FIELDS}
    return {name: value or None for name, value in given.items() if value is not None}


def _print_keys(found: list[Any], as_json: bool) -> None:
    """Prefixes, teams, state and times: never a hash or a secret."""

    def line(r: dict[str, Any]) -> str:
        expires = f"  expires {r['expires_at']}" if r["expires_at"] else ""
        name = f"  {r['name']!r}" if r["name"] else ""
        name += f"  models {','.join(r['models'])}" if r["models"] else ""
        name += "".join(
            f"  {n} {model_limits_text(v) if n == 'model_limits' else v}"
            for n, v in r["limits"].items()
            if v is not None
        )
        return f"{r['prefix']}  {r['team']}{name}  {r['state']}  created {r['created_at']}{expires}"

    _show([k.record() for k in found], as_json, line)


def _print_blocked(blocks: list[Any], as_json: bool) -> None:
    from tokenyard.tenancy.end_users import block_record

    def line(r: dict[str, Any]) -> str:
        why = f"  ({r['reason']})" if r["reason"] else ""
        return f"{r['user']}  since {r['created_at']}{why}"

    _show([block_record(b) for b in blocks], as_json, line)


def _print_changes(changes: list[Any], as_json: bool) -> None:
    from tokenyard.tenancy.changes import change_record

    def line(r: dict[str, Any]) -> str:
        key = f" {r['key_prefix']}" if r["key_prefix"] else ""
        details = f"  {json.dumps(r['details'])}" if r["details"] else ""
        return f"{r['at']}  {r['actor']}  {r['action']}  {r['team']}{key}{details}"

    _show([change_record(c) for c in changes], as_json, line)


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON, for scripts")


def add_parser(sub: Any) -> None:
    teams = sub.add_parser(
        "teams",
        help="create, update, show, list, disable, enable or delete teams; block end users; "
        "their changes",
    )
    tsub = teams.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, what in (("create", "a new team"), ("update", "a team's limits")):
        t = tsub.add_parser(action, help=what)
        t.add_argument("name", help="the team's name (letters, digits, . _ -)")
        for field, kind in LIMIT_FIELDS.items():
            flag = "--" + field.replace("_", "-")
            parse = _model_limits if kind is dict else kind
            t.add_argument(flag, dest=field, type=parse, default=None, help=LIMIT_HELP[field])
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
    block = tsub.add_parser(
        "block", help="refuse a team's requests that name this end user (safety_identifier/user)"
    )
    unblock = tsub.add_parser("unblock", help="let a blocked end user's requests through again")
    for p in (block, unblock):
        p.add_argument("name", help="the team")
        p.add_argument("user", help="the end user, as the team's requests name it")
    block.add_argument("--reason", default=None, help="a note: an audit row, a ticket")
    blocked = tsub.add_parser("blocked", help="the end users a team blocks")
    blocked.add_argument("name")
    _json_flag(blocked)
    trail = tsub.add_parser(
        "changes", help="who changed which team or key, and how, newest first (the audit trail)"
    )
    trail.add_argument("name", nargs="?", default=None, help="one team's (default: every team's)")
    trail.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    _json_flag(trail)
    teams.set_defaults(run=_teams)

    keys_p = sub.add_parser("keys", help="create, list, revoke or rotate API keys")
    ksub = keys_p.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = ksub.add_parser("create", help="a new key for a team, printed once")
    create.add_argument("--team", required=True, help="the team the key belongs to")
    update = ksub.add_parser("update", help="change a key's name, expiry, models or limits")
    update.add_argument("prefix", help="the key's visible prefix, as keys list shows it")
    update.add_argument("--no-expiry", action="store_true", help="the key no longer expires")
    _json_flag(update)
    for p in (create, update):
        p.add_argument("--name", default=None, help="a label shown in listings, e.g. ci")
        p.add_argument(
            "--models",
            default=None,
            help="comma-separated models the key may use, within its team's (create's default, "
            "or '' on update: the team's)",
        )
        p.add_argument(
            "--expires-in-days",
            type=float,
            default=None,
            help="refuse the key this many days from now (create's default: never)",
        )
        for field in KEY_LIMIT_FIELDS:  # the key's own, beside its team's
            kind = LIMIT_FIELDS[field]
            p.add_argument(
                "--" + field.replace("_", "-"),
                dest=field,
                type=_model_limits if kind is dict else kind,
                default=None,
                help=f"the key's own limit, beside its team's: {LIMIT_HELP[field].split(' (')[0]} "
                f"(default, or {'' if kind is dict else 0!r}: the team's alone)",
            )
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
