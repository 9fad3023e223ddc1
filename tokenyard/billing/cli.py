"""`tokenyard billing report --date D [--end E] [--team T] [--by day|key|user|metadata] [--csv]`:
the daily rollups from SQL, or each API key's, end user's or metadata value's totals over the
range. `tokenyard billing alerts [--date D] [--end E] [--team T] [--json]`: the budget alerts.
`tokenyard billing requests [--team T] [--model M] [--errors] ...`: each request's record."""

import argparse
import json
import sys
from datetime import UTC, date, datetime
from typing import Any

from tokenyard.core.settings import get_settings

_SUMS = ("requests", "errors", "in", "cached", "cache writes", "out", "cost $", "list $")
_HEADER = ("day", "team", "model", *_SUMS)
_KEY_HEADER = ("key prefix", "team", *_SUMS)
_USER_HEADER = ("end user", "team", *_SUMS)


def _print(table: list[tuple[str, ...]]) -> None:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def _sums(totals: dict[str, Any]) -> tuple[str, ...]:
    """A rollup row's or a key's totals, as the table prints them."""
    counts = ("requests", "errors", "prompt_tokens", "cached_tokens", "cache_write_tokens")
    counts += ("completion_tokens",)
    dollars = (f"{totals[name]:.6f}" for name in ("cost_usd", "list_cost_usd"))
    return (*(str(totals[name]) for name in counts), *dollars)


def _engine() -> Any:
    from tokenyard.core.db import database_url, get_engine

    return get_engine(database_url(get_settings()))


def _days(args: argparse.Namespace) -> tuple[date, date] | None:
    """--date and --end (default: today, one day); None after saying what is wrong."""
    try:
        start = date.fromisoformat(args.date) if args.date else datetime.now(UTC).date()
        return start, date.fromisoformat(args.end) if args.end else start
    except ValueError as exc:
        print(f"error: dates are YYYY-MM-DD: {exc}", file=sys.stderr)
        return None


def _report(args: argparse.Namespace) -> int:
    from tokenyard.billing import reports

    days = _days(args)
    if days is None:
        return 2
    start, end = days
    engine = _engine()
    if args.by == "key":
        per_key = reports.by_key(engine, start, end, args.team)
        if args.csv:
            sys.stdout.write(reports.keys_to_csv(per_key))
        else:
            _print([_KEY_HEADER, *((p, k["team"], *_sums(k)) for p, k in sorted(per_key.items()))])
        return 0
    if args.by in ("user", "metadata"):
        if args.by == "user":
            found = reports.by_end_user(engine, start, end, args.team, args.limit)
            columns, header = reports.USER_CSV_COLUMNS, _USER_HEADER
        elif not args.key:
            print("error: --by metadata needs --key, the metadata key to group by", file=sys.stderr)
            return 2
        else:
            try:
                found = reports.by_metadata(engine, start, end, args.team, args.key, args.limit)
            except ValueError as exc:  # a key the report cannot name
                print(f"error: {exc}", file=sys.stderr)
                return 2
            columns, header = reports.METADATA_CSV_COLUMNS, (args.key, "team", *_SUMS)
        if args.csv:
            sys.stdout.write(reports.labelled_to_csv(found, columns))
        else:
            label = columns[0]
            _print([header, *((r[label] or "-", r["team"], *_sums(r)) for r in found)])
        return 0
    rows = reports.daily(engine, start, end, args.team)
    if args.csv:
        sys.stdout.write(reports.to_csv(rows))
        return 0
    lines = [(r.day.isoformat(), r.team, r.model, *_sums(r.model_dump())) for r in rows]
    _print([_HEADER, *lines])
    return 0


def _alerts(args: argparse.Namespace) -> int:
    from tokenyard.billing import alerts

    days = _days(args)
    if days is None:
        return 2
    start, end = days
    engine = _engine()
    found = alerts.listed(engine, start, end, args.team, args.limit)
    if args.json:
        for alert in found:
            print(json.dumps(alert))
        return 0
    for alert in found:
        sent = "sent" if alert["delivered_at"] else "not sent"
        stamp = datetime.fromtimestamp(alert["created_at"], UTC).isoformat(timespec="seconds")
        print(f"{stamp}  {alert['text']}  ({sent})")
    return 0


def _requests(args: argparse.Namespace) -> int:
    from tokenyard.billing import request_log

    engine = _engine()
    filters = request_log.Filters(
        model=args.model,
        key_prefix=args.key,
        end_user=args.user,
        request_id=args.request_id,
        errors=args.errors,
    )
    for entry in request_log.recent(engine, args.team, filters, args.limit):
        if args.json:
            print(json.dumps(entry))
            continue
        tokens = f"{entry['prompt_tokens']}+{entry['completion_tokens']} tok"
        how = entry["finish_reason"] or entry["error"] or ""
        print(
            f"{entry['started_at'][:19]}  {entry['request_id']}  {entry['team']}  "
            f"{entry['model_served']}  {entry['status']} {how}  {tokens}  "
            f"${entry['cost_usd']:.6f}  {entry['latency_s']:.3f} s"
        )
    return 0


def add_parser(sub: Any) -> None:
    billing = sub.add_parser("billing", help="usage and cost reports")
    bsub = billing.add_subparsers(dest="action", required=True)
    report = bsub.add_parser("report", help="per team, model and day (UTC)")
    report.add_argument("--date", default=None, help="YYYY-MM-DD (default: today)")
    report.add_argument("--end", default=None, help="last day of a range (default: --date)")
    report.add_argument("--team", default=None, help="one team (default: all)")
    report.add_argument(
        "--by",
        choices=("day", "key", "user", "metadata"),
        default="day",
        help="rows per day and model, per API key, per end user, or per value of a metadata key "
        "(dearest first)",
    )
    report.add_argument("--key", default=None, help="--by metadata: the key of requests' metadata")
    report.add_argument(
        "--limit", type=int, default=100, help="--by user or metadata: at most this many rows"
    )
    report.add_argument("--csv", action="store_true", help="CSV instead of a table")
    report.set_defaults(run=_report)
    listing = bsub.add_parser("alerts", help="budget alerts recorded (a budget's percent crossed)")
    listing.add_argument("--date", default=None, help="YYYY-MM-DD (default: today)")
    listing.add_argument("--end", default=None, help="last day of a range (default: --date)")
    listing.add_argument("--team", default=None, help="one team (default: all)")
    listing.add_argument("--limit", type=int, default=100, help="at most this many, newest first")
    listing.add_argument("--json", action="store_true", help="one JSON object a line")
    listing.set_defaults(run=_alerts)
    log = bsub.add_parser("requests", help="each request's record, newest first")
    log.add_argument("--team", default=None, help="one team (default: all)")
    log.add_argument("--model", default=None, help="asked or served")
    log.add_argument("--key", default=None, help="one key's, by its prefix")
    log.add_argument("--user", default=None, help="one end user's")
    log.add_argument("--request-id", default=None, help="the gateway's id, or the client's own")
    log.add_argument("--errors", action="store_true", help="only requests that did not end 200")
    log.add_argument("--limit", type=int, default=50, help="at most this many")
    log.add_argument("--json", action="store_true", help="one JSON object a line")
    log.set_defaults(run=_requests)
