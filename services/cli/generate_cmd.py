"""``tessera generate --model M [--image FILE ...] --prompt TEXT --max-tokens N [--json]``."""

from __future__ import annotations

import argparse
import base64
import json
import mimetypes
import sys
from pathlib import Path

from services.engine.config import EngineConfig
from services.engine.sampling_params import SamplingParams
from services.preprocess.errors import PreprocessError


def register(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser("generate", help="generate text for one prompt (with images) in this process")
    cmd.add_argument("--model", default="tiny", help="tiny, small, or a checkpoint directory")
    cmd.add_argument("--image", action="append", default=[], type=Path, help="image file; repeat for several (placed before the text)")
    cmd.add_argument("--prompt", required=True)
    cmd.add_argument("--max-tokens", type=int, default=64)
    cmd.add_argument("--temperature", type=float, default=0.0)
    cmd.add_argument("--top-p", type=float, default=1.0)
    cmd.add_argument("--top-k", type=int, default=0)
    cmd.add_argument("--seed", type=int, default=None)
    cmd.add_argument("--stop", action="append", default=[], help="stop string; repeatable")
    cmd.add_argument("--ignore-eos", action="store_true")
    cmd.add_argument("--json", action="store_true", help="print token ids and usage as JSON")
    EngineConfig.add_cli_arguments(cmd)
    cmd.set_defaults(func=run)


def _image_part(path: Path) -> dict:
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"}}


def run(args: argparse.Namespace) -> int:
    from services.engine.engine import RequestRejectedError  # these load torch: only when this command runs
    from services.engine.llm import LLM
    from services.gateway.frontend.prompt_wire import prompt_for_library

    try:
        content = [_image_part(path) for path in args.image] + [{"type": "text", "text": args.prompt}]
        sampling = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=tuple(args.stop),
            ignore_eos=args.ignore_eos,
        )
        llm = LLM(args.model, EngineConfig.from_sources(args))
        [result] = llm.generate([prompt_for_library({"messages": [{"role": "user", "content": content}]})], sampling)
    except OSError as exc:
        print(f"error: cannot read image: {exc}", file=sys.stderr)
        return 2
    except PreprocessError as exc:
        print(f"error ({exc.code}): {exc.message}", file=sys.stderr)
        return 1
    except (RequestRejectedError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(
            {
                "text": result.text,
                "token_ids": result.token_ids,
                "finish_reason": result.finish_reason,
                "usage": {
                    "prompt_tokens": result.usage.prompt_tokens,
                    "completion_tokens": result.usage.completion_tokens,
                    "total_tokens": result.usage.total_tokens,
                    "prompt_tokens_details": {"cached_tokens": result.usage.cached_tokens},
                },
            },
            sys.stdout,
        )
        sys.stdout.write("\n")
    else:
        print(result.text)
    return 0
