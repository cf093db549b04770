"""``tessera serve``: the whole local stack (no --role), or one role's server (--role R)."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.engine.config import EngineConfig
from services.preprocess.config import PreprocessConfig
from services.stack.roles import ROLES, setting_names

_STACK_FLAGS = {
    "--port",
    "--host",
    "--generate-port",
    "--no-restart",
    "--state-file",
    "--model",
    "--role",
    "--preprocess",
    "--encoders",
    "--prefill",
    "--decode",
    "--routing-policy",
    "--runner",
    "--index-url",
    "--pin-cpus",
    "--no-zygote",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser("serve", help="serve the whole stack locally, or one role with --role")
    cmd.add_argument("--role", choices=ROLES, default=None, help="run one role's server instead of the whole stack")
    cmd.add_argument("--model", default="tiny", help="tiny, small, or a checkpoint directory")
    stack = cmd.add_argument_group("stack (no --role)")
    stack.add_argument("--host", default="127.0.0.1")
    stack.add_argument("--port", type=int, default=8000, help="HTTP port of the OpenAI-compatible API")
    stack.add_argument("--generate-port", type=int, default=50051, help="port of the public gRPC Generate service")
    stack.add_argument("--no-restart", action="store_true", help="do not restart a role that dies")
    stack.add_argument("--state-file", type=Path, default=None, help="write role pids and addresses here (JSON)")
    stack.add_argument("--preprocess", type=int, default=1, help="number of preprocess nodes")
    stack.add_argument("--encoders", type=int, default=1, help="number of encoder nodes")
    stack.add_argument("--prefill", type=int, default=1, help="number of prefill nodes")
    stack.add_argument("--decode", type=int, default=1, help="number of decode nodes")
    stack.add_argument(
        "--pin-cpus", action="store_true", help="pin each encoder, prefill and decode node to its own cores (when their shares fit)"
    )
    stack.add_argument(
        "--no-zygote",
        action="store_true",
        help="start each node as a new interpreter instead of forking it from one that loaded their common imports (slower)",
    )
    role = cmd.add_argument_group("one role (--role)")
    for name in setting_names():
        if name == "served_model_name":  # vLLM's spelling, names apart (a b), as well as a,b
            role.add_argument("--served-model-name", dest=f"role_{name}", nargs="+", default=None, type=str)
        elif name != "model":
            role.add_argument("--" + name.replace("_", "-"), dest=f"role_{name}", default=None)
    EngineConfig.add_cli_arguments(cmd)
    PreprocessConfig.add_cli_arguments(cmd)
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.role is None:
        return _run_stack(args)
    from services.stack.roles import role_settings, run_role

    flags = argparse.Namespace(
        model=args.model, **{name: _flag_value(getattr(args, f"role_{name}", None)) for name in setting_names() if name != "model"}
    )
    run_role(args.role, role_settings(args.role, flags), EngineConfig.from_sources(args), PreprocessConfig.from_sources(args))
    return 0


def _flag_value(value: str | list[str] | None) -> str | None:
    """A flag that takes several values (--served-model-name a b) as the setting's one string."""
    return ",".join(value) if isinstance(value, list) else value


def _run_stack(args: argparse.Namespace) -> int:
    import sys

    from services.stack.launcher import Stack, StackConfig

    passthrough = _passthrough(sys.argv)
    stack = Stack(
        StackConfig(
            model=args.model,
            host=args.host,
            http_port=args.port,
            generate_port=args.generate_port,
            index_url=args.role_index_url or "",
            restart_roles=not args.no_restart,
            state_file=args.state_file,
            passthrough=passthrough,
            num_preprocess=args.preprocess,
            num_encoders=args.encoders,
            num_prefill=args.prefill,
            num_decode=args.decode,
            routing_policy=args.role_routing_policy or "cache_aware",
            runner=args.role_runner or "generate",
            pin_cpus=args.pin_cpus,
            zygote=not args.no_zygote,
        )
    )
    try:
        stack.start()
    except BaseException:
        stack.stop()
        raise
    stack.supervise()
    return 0


def _passthrough(argv: list[str]) -> list[str]:
    """Engine and preprocessing flags given to the stack, forwarded to every role."""
    args = argv[argv.index("serve") + 1 :] if "serve" in argv else []
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _STACK_FLAGS:
            skip = "=" not in arg and name not in ("--no-restart", "--pin-cpus", "--no-zygote")
            continue
        out.append(arg)
    return out
