"""`tokenyard router …`: train the complexity classifier."""

import argparse
from pathlib import Path


def _train(args: argparse.Namespace) -> int:
    # imported here so the rest of the CLI starts without loading scikit-learn
    from router.train import ARTIFACT_DIR, TrainConfig, train

    out_dir = Path(args.out) if args.out else ARTIFACT_DIR
    train(TrainConfig(seed=args.seed, bootstrap_resamples=args.bootstrap), out_dir)
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
    train.set_defaults(run=_train)
