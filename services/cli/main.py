"""``tessera``: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import os
import sys

from services.cli import ops_cmd
from shared.colocation import cpu_budget


def build_parser(*, probes_only: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera", description="Disaggregated vision-language model serving.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    ops_cmd.register(subparsers)
    if not probes_only:  # these import torch (seconds): container probes must not pay for it
        from services.cli import bench_cmd, generate_cmd, models_cmd, preprocess_cmd, serve_cmd

        models_cmd.register(subparsers)
        preprocess_cmd.register(subparsers)
        generate_cmd.register(subparsers)
        serve_cmd.register(subparsers)
        bench_cmd.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # HF_HUB_OFFLINE is the operator's: a Hub id downloads unless it is set (services/models/hub.py).
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    argv = sys.argv[1:] if argv is None else argv
    _claim_cpu_share(argv)
    args = build_parser(probes_only=bool(argv) and argv[0] in ops_cmd.COMMANDS).parse_args(argv)
    return int(args.func(args) or 0)


def _claim_cpu_share(argv: list[str]) -> None:
    """A role's CPU share (threads, wait policy, cores) must be in effect before torch and its
    OpenMP runtime load, which importing the subcommands does; so it is claimed here, from the
    raw arguments."""
    if not argv or argv[0] != "serve":
        return
    role = next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--role=")), None)
    if role is None and "--role" in argv[:-1]:
        role = argv[argv.index("--role") + 1]
    if role is not None:
        cpu_budget.apply_before_torch(cpu_budget.share_for_this_node(role))


if __name__ == "__main__":
    sys.exit(main())
