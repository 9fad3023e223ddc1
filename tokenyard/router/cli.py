"""`tokenyard router …`: train the complexity classifier."""

import argparse
from pathlib import Path
from typing import Any


def _train(args: argparse.Namespace) -> int:
    # imported here so the rest of the CLI starts without loading scikit-learn
    import numpy as np

    from tokenyard.router.training.train import ARTIFACT_DIR, TrainConfig, train

    rated = None
    if args.feedback:
        # the ratings are billing's rows (a CLI entry point may read any layer)
        from tokenyard.billing.feedback import feedback_rows
        from tokenyard.core.db import database_url, get_engine
        from tokenyard.core.settings import get_settings
        from tokenyard.router.features import ratings

        rated = ratings(feedback_rows(get_engine(database_url(get_settings()))))
        models, counts = np.unique(rated.model, return_counts=True)
        by_model = ", ".join(f"{m} {c}" for m, c in zip(models, counts, strict=True))
        print(f"feedback: {len(rated)} rated auto-routed requests ({by_model or 'none'})")
    out_dir = Path(args.out) if args.out else ARTIFACT_DIR
    train(TrainConfig(seed=args.seed, bootstrap_resamples=args.bootstrap), out_dir, rated)
    print(f"wrote the artifact and its report to {out_dir}")
    return 0


def _check(args: argparse.Namespace) -> int:
    import asyncio
    import json
    from dataclasses import asdict

    import redis.asyncio as aioredis

    from tokenyard.core.settings import get_settings
    from tokenyard.router.catalog import load_catalog
    from tokenyard.router.upstreams import build_backends, check_models

    settings = get_settings()
    catalog = load_catalog(settings)

    async def run() -> list[Any]:
        # the backends' breakers want a Redis client; a check never calls it (no breaker, no
        # limit applies), so an unconnected one will do where none is configured
        url = settings.redis_url.get_secret_value() if settings.redis_url else ""
        redis = aioredis.Redis.from_url(url) if url else aioredis.Redis()
        backends = build_backends(catalog, redis, settings)
        try:
            return await check_models(catalog, backends, args.model)
        finally:
            await backends.aclose()
            await redis.aclose()

    try:
        checks = asyncio.run(run())
    except ValueError as exc:
        print(exc)
        return 2
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            outcome = "ok" if c.ok else f"FAILED {c.status or '-'} {c.error}"
            print(f"{c.model:28} {c.at:40} {c.latency_ms:8.1f} ms  {outcome}")
    return 0 if all(c.ok for c in checks) else 1


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    router = subparsers.add_parser("router", help="the learned complexity router")
    sub = router.add_subparsers(dest="router_command", required=True)
    train = sub.add_parser(
        "train", help="train the complexity classifier; write its artifact and evaluation report"
    )
    train.add_argument("--seed", type=int, default=0, help="splits, model and bootstrap seed")
    train.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    train.add_argument("--out", default="", help="output directory (default: router/artifacts)")
    train.add_argument(
        "--feedback",
        action="store_true",
        help="also train on the platform's rated auto-routed requests (the database of "
        "TOKENYARD_DATABASE_URL; docs/router.md)",
    )
    train.set_defaults(run=_train)

    models = subparsers.add_parser("models", help="the catalog's models")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    checking = models_sub.add_parser(
        "check",
        help="send each configured model's deployments (or replicas) the smallest real request, "
        "once, and say which answer (exit 1 if any does not)",
    )
    checking.add_argument("model", nargs="*", help="only these models (default: all configured)")
    checking.add_argument("--json", action="store_true", help="print the checks as JSON")
    checking.set_defaults(run=_check)
