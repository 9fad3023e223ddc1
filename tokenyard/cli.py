"""`tokenyard` console script: each package contributes its subcommands."""

import argparse
import importlib
import sys

# (module, function) pairs that add a subcommand to the parser; a package joins the CLI here.
SUBCOMMANDS = [
    ("engine.cli", "add_parser"),
    ("router.cli", "add_parser"),
    ("gateway.cli", "add_parser"),
    ("billing.cli", "add_parser"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenyard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module, func in SUBCOMMANDS:
        getattr(importlib.import_module(module), func)(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.run(args) or 0)
