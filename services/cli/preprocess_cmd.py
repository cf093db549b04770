"""``tessera preprocess --model M REQUEST.json``: print token ids, placeholder ranges and mm_hashes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from services.models.registry import ModelNotFoundError, resolve_model
from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import PreprocessError


def register(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser("preprocess", help="run multimodal preprocessing on a request and print the result")
    cmd.add_argument("request", help="request JSON file ('-' for stdin): messages, prompt or prompt_token_ids")
    cmd.add_argument("--model", default="tiny", help="tiny, small, or a checkpoint directory")
    cmd.add_argument("--positions", action="store_true", help="also print M-RoPE position ids")
    PreprocessConfig.add_cli_arguments(cmd)
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Torch and the request models load only when this command runs, not for every `tessera`.
    from pydantic import ValidationError

    from services.gateway.frontend.prompt_wire import prompt_for_library
    from services.gateway.protocol.validation_errors import validation_error
    from services.preprocess.preprocessor import Preprocessor

    try:
        raw = sys.stdin.read() if args.request == "-" else Path(args.request).read_text()
        prompt = prompt_for_library(json.loads(raw))
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: cannot read request JSON: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # an OpenAI-shaped body the API refuses: said as the gateway says it
        print(f"error: invalid request: {validation_error(exc.errors())}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:  # not an OpenAI-shaped body
        print(f"error: invalid request: {exc}", file=sys.stderr)
        return 2
    try:
        config = PreprocessConfig.from_sources(args)
        preprocessor = Preprocessor(resolve_model(args.model), config)
        result = preprocessor.preprocess(prompt)
    except PreprocessError as exc:
        print(f"error ({exc.code}): {exc.message}", file=sys.stderr)
        return 1
    except (ValueError, ModelNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = result.to_json_dict()
    if args.positions:
        out["mrope_positions"] = result.mrope_positions.tolist()
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0
