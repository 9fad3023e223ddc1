"""`tokenyard guard …`: train the safety classifier, rebuild its data, set teams' policies, read the
audit log, score a text."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _sql() -> Any:
    from tokenyard.core.db import database_url, get_engine
    from tokenyard.core.settings import get_settings

    return get_engine(database_url(get_settings()))


def _forget(team: str) -> None:
    """Best effort: drop the Redis-cached policy so gateways apply the change within their
    in-process TTL."""
    import redis

    from tokenyard.core.redis_client import embedded_redis
    from tokenyard.core.settings import get_settings
    from tokenyard.guard.store import cache_key

    settings = get_settings()
    try:
        if settings.redis_url:
            client = redis.Redis.from_url(settings.redis_url.get_secret_value(), socket_timeout=1)
        else:
            client = embedded_redis(settings.data_dir)
        client.delete(cache_key(team))
    except redis.RedisError:
        pass


def _train(args: argparse.Namespace) -> int:
    from tokenyard.guard.classifier import ARTIFACT_DIR
    from tokenyard.guard.training.train import TrainConfig, train

    out = Path(args.out) if args.out else ARTIFACT_DIR
    config = TrainConfig(seed=args.seed, loso=not args.no_loso, jobs=args.jobs)
    report = train(config, out)
    for name, m in report["test"]["binary"].items():
        print(f"test {name}: AUPRC {m['auprc']}")
    if "loso" in report:
        for name, m in report["loso"]["binary"].items():
            print(f"LOSO {name}: AUPRC {m['auprc']}")
    print(f"wrote the artifact and its report to {out}")
    return 0


def _data(args: argparse.Namespace) -> int:
    from tokenyard.guard.training import dataset

    out = Path(args.out)
    counts = dataset.write(dataset.build(Path(args.source)), out)
    evaluation = dataset.write(dataset.build_eval(Path(args.source)), out / "eval")
    print(json.dumps({"train": counts, "evaluation only": evaluation}, indent=2))
    return 0


def _thresholds() -> dict[str, float]:
    import json as _json

    from tokenyard.guard.classifier import DEFAULT_ARTIFACT

    return _json.loads(DEFAULT_ARTIFACT.with_suffix(".json").read_text())["thresholds"]


def _print_policy(team: str, policy: Any, as_json: bool, own: bool) -> None:
    from tokenyard.guard.policy import as_table

    rows = as_table(policy, _thresholds())
    if as_json:
        out = {"team": team, "own_policy": own, "store_text": policy.store_text, "rules": rows}
        out["terms"] = list(policy.terms)
        print(json.dumps(out, indent=2))
        return
    source = "its own policy" if own else "the platform default"
    print(f"team {team}: {source}; audit rows keep the text: {policy.store_text}")
    if policy.terms:
        print("  blocklist: " + "; ".join(policy.terms))
    for r in rows:
        mark = " (default)" if r["default_threshold"] else ""
        threshold = "–" if r["threshold"] is None else f"{r['threshold']:.3f}"
        print(f"  {r['direction']:6} {r['category']:24} {r['action']:5} @ {threshold}{mark}")


def _policy(args: argparse.Namespace) -> int:
    from tokenyard.guard import store
    from tokenyard.guard.policy import DEFAULT, apply, parse_change, terms_of
    from tokenyard.tenancy.teams import get_team

    sql = _sql()
    try:
        if args.action == "list":
            for team in store.policy_teams(sql):
                print(team)
            return 0
        if get_team(sql, args.team) is None:
            raise ValueError(f"no team {args.team!r}")
        current = store.read_policy(sql, args.team)
        if args.action == "show":
            _print_policy(args.team, current or DEFAULT, args.json, current is not None)
            return 0
        if args.action == "reset":
            store.delete_policy(sql, args.team)
            _forget(args.team)
            _print_policy(args.team, DEFAULT, args.json, False)
            return 0
        changes = [parse_change(spec) for spec in args.changes]
        store_text = {"on": True, "off": False}.get(args.store_text or "")
        terms = terms_of(args.term) if args.term is not None else None
        policy = apply(current or DEFAULT, changes, store_text, terms)
        store.write_policy(sql, args.team, policy)
        _forget(args.team)
        _print_policy(args.team, policy, args.json, True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _audit(args: argparse.Namespace) -> int:
    from tokenyard.guard.store import audit_rows, to_dict

    rows = audit_rows(
        _sql(),
        team=args.team,
        action=args.action,
        direction=args.direction,
        request_id=args.request_id,
        limit=args.limit,
        end_user=args.user,
    )
    for row in rows:
        print(json.dumps(to_dict(row)))
    return 0


def _score(args: argparse.Namespace) -> int:
    from tokenyard.guard.classifier import DEFAULT_ARTIFACT, SafetyClassifier

    clf = SafetyClassifier.load(Path(args.artifact) if args.artifact else DEFAULT_ARTIFACT)
    text = sys.stdin.read() if args.text == "-" else args.text
    scores = clf.scores(text)
    thresholds = clf.thresholds()
    for head, score in scores.items():
        mark = " *" if score >= thresholds[head] else ""
        print(f"{head:24} {score:.4f} (threshold {thresholds[head]:.3f}){mark}")
    return 0


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    guard = subparsers.add_parser("guard", help="the safety layer (docs/guard.md)")
    sub = guard.add_subparsers(dest="guard_command", required=True)

    train = sub.add_parser(
        "train", help="train the safety classifier; write its artifact and evaluation report"
    )
    train.add_argument("--seed", type=int, default=0, help="split seed")
    train.add_argument("--out", default="", help="output directory (default: guard/artifacts)")
    train.add_argument(
        "--no-loso", action="store_true", help="skip the leave-one-source-out evaluation (fast)"
    )
    train.add_argument("--jobs", type=int, default=2, help="heads fitted at once")
    train.set_defaults(run=_train)

    data = sub.add_parser(
        "data", help="rebuild guard/data from the public sets (shared/data/safety), decontaminated"
    )
    data.add_argument("--source", default="/work/shared/data/safety", help="the sets' folder")
    data.add_argument("--out", default=str(Path(__file__).parent / "data"), help="output folder")
    data.set_defaults(run=_data)

    policy = sub.add_parser(
        "policy",
        help="a team's policy: per category and direction, off, flag or block, with a threshold; "
        "per kind of personal data, off, flag, block or mask",
    )
    policy.add_argument("action", choices=["show", "set", "reset", "list"])
    policy.add_argument("team", nargs="?", default="", help="the team (not for list)")
    policy.add_argument(
        "changes",
        nargs="*",
        help="direction.category=action[@threshold]: input.violence=block@0.8, "
        "output.hate=flag, input.jailbreak=off, *.illicit=block (both directions), "
        "input.*=off (every category), pii.email=mask, pii.*=flag (personal data)",
    )
    policy.add_argument(
        "--store-text",
        choices=["on", "off"],
        help="audit rows keep the flagged text (default off: scores only)",
    )
    policy.add_argument(
        "--term",
        action="append",
        default=None,
        help="a term of the team's blocklist (repeat for each; the list given replaces the old "
        "one, --term '' empties it); pii.blocklist=flag|block|mask sets what a match does",
    )
    policy.add_argument("--json", action="store_true", help="print JSON")
    policy.set_defaults(run=_policy)

    audit = sub.add_parser("audit", help="the newest audit rows (flags and blocks) as JSON lines")
    audit.add_argument("--team", default=None)
    audit.add_argument("--action", choices=["flag", "block"], default=None)
    audit.add_argument("--direction", choices=["input", "output"], default=None)
    audit.add_argument("--request-id", default=None)
    audit.add_argument("--user", default=None, help="one end user's (safety_identifier or user)")
    audit.add_argument("--limit", type=int, default=50, help="rows (newest first)")
    audit.set_defaults(run=_audit)

    score = sub.add_parser("score", help="score one text with the classifier ('-': stdin)")
    score.add_argument("text")
    score.add_argument("--artifact", default="", help="a .joblib (default: the shipped one)")
    score.set_defaults(run=_score)
