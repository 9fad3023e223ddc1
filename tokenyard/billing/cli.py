"""`tokenyard billing report --date D [--end E] [--team T] [--csv]`: the daily rollups from SQL."""

import argparse
import sys
from datetime import UTC, date, datetime
from typing import Any

from tokenyard.core.settings import get_settings

_HEADER = ("day", "team", "model", "requests", "errors", "in", "cached", "out", "cost $", "list $")


def _report(args: argparse.Namespace) -> int:
    from tokenyard.billing import reports
    from tokenyard.core.db import database_url, get_engine

    try:
        start = date.fromisoformat(args.date) if args.date else datetime.now(UTC).date()
        end = date.fromisoformat(args.end) if args.end else start
    except ValueError as exc:
        print(f"error: dates are YYYY-MM-DD: {exc}", file=sys.stderr)
        return 2
    rows = reports.daily(get_engine(database_url(get_settings())), start, end, args.team)
    if args.csv:
        sys.stdout.write(reports.to_csv(rows))
        return 0
    table = [_HEADER] + [
        (
            row.day.isoformat(),
            row.team,
            row.model,
            *map(str, (row.requests, row.errors, row.prompt_tokens)),
            *map(str, (row.cached_tokens, row.completion_tokens)),
            f"{row.cost_usd:.6f}",
            f"{row.list_cost_usd:.6f}",
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADER))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return 0


def add_parser(sub: Any) -> None:
    billing = sub.add_parser("billing", help="usage and cost reports")
    bsub = billing.add_subparsers(dest="action", required=True)
    report = bsub.add_parser("report", help="per team, model and day (UTC)")
    report.add_argument("--date", default=None, help="YYYY-MM-DD (default: today)")
    report.add_argument("--end", default=None, help="last day of a range (default: --date)")
    report.add_argument("--team", default=None, help="one team (default: all)")
    report.add_argument("--csv", action="store_true", help="CSV instead of a table")
    report.set_defaults(run=_report)
