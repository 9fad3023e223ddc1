"""`tokenyard router …`: train the complexity classifier."""

import argparse
from pathlib import Path


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
