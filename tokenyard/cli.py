"""`tokenyard` console script: each package contributes its subcommands."""

import argparse
import importlib
import importlib.metadata
import sys

from tokenyard.core.settings import configure_logging, get_settings

# (module, function) pairs that add a subcommand to the parser; a package joins the CLI here.
SUBCOMMANDS = [
    ("tokenyard.engine.cli", "add_parser"),
    ("tokenyard.embeddings.cli", "add_parser"),
    ("tokenyard.router.cli", "add_parser"),
    ("tokenyard.guard.cli", "add_parser"),
    ("tokenyard.tenancy.cli", "add_parser"),
    ("tokenyard.serve", "add_parser"),
    ("tokenyard.up", "add_parser"),
    ("tokenyard.billing.cli", "add_parser"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenyard", description=__doc__)
    version = importlib.metadata.version("tokenyard")
    parser.add_argument("--version", action="version", version=f"tokenyard {version}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module, func in SUBCOMMANDS:
        getattr(importlib.import_module(module), func)(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a bare `tokenyard`: what it can do
        parser.print_help()
        sys.exit(0)
    configure_logging(get_settings())
    sys.exit(args.run(args) or 0)
