"""``tessera models build NAME [--out DIR]``: any built-in of any family.
``tessera models download ORG/NAME[@REVISION]``: a Hub checkpoint into the Hugging Face cache (a
Kubernetes init step; the roles then load it offline)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.models.builtins.build import build_builtin, is_complete_build
from services.models.registry import BUILTIN_TO_FAMILY, builtin_path


def register(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser("models", help="manage built-in models")
    actions = models.add_subparsers(dest="models_command", required=True)
    build = actions.add_parser("build", help="generate a built-in model checkpoint deterministically, offline")
    build.add_argument("name", choices=sorted(BUILTIN_TO_FAMILY))
    build.add_argument("--out", type=Path, default=None, help="output directory (default: $TESSERA_HOME/models/NAME)")
    build.add_argument(
        "--if-missing", action="store_true", help="do nothing if a complete build is there (init containers: nodes may be reading it)"
    )
    build.set_defaults(func=run_build)
    fetch = actions.add_parser("download", help="download a Hub checkpoint (config, tokenizer, processor, safetensors) into the cache")
    fetch.add_argument("reference", help="org/name or org/name@revision (HF_TOKEN, HF_HOME and HF_ENDPOINT apply)")
    fetch.set_defaults(func=run_download)


def run_build(args: argparse.Namespace) -> int:
    out = args.out if args.out is not None else builtin_path(args.name)
    if args.if_missing and is_complete_build(out):
        print(out)
        return 0
    build_builtin(args.name, BUILTIN_TO_FAMILY[args.name].load(), out, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(out)
    return 0


def run_download(args: argparse.Namespace) -> int:
    from services.models.hub import HubModelError, download, parse_hub_reference

    reference = parse_hub_reference(args.reference)
    if reference is None:
        print(f"{args.reference!r} is not a Hub id (org/name[@revision])", file=sys.stderr)
        return 2
    try:
        print(download(reference))
    except HubModelError as exc:
        print(f"tessera models download: {exc}", file=sys.stderr)
        return 1
    return 0
