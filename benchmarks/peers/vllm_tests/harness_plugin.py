"""A pytest plugin, loaded into vLLM's own entrypoint tests (run by run.py with the vLLM venv's
python), that points their ``RemoteOpenAIServer`` at a server of our choosing.

vLLM's tests start ``vllm serve MODEL_NAME ARGS`` and talk to it with the official openai client.
Here the model is our built-in, served under the name the test uses:
  * target ``vllm``: ``vllm serve`` itself, as the test asks, on the built-in's vLLM-loadable copy,
    in float32 and without the multimodal profile (benchmarks/peers/README.md);
  * target ``tessera``: ``tessera serve --model BUILTIN --served-model-name MODEL_NAME``, with the
    test's ``--max-model-len``, ``--enable-force-include-usage``, ``--max-logprobs``, ``--root-path`` and API key
    (``VLLM_API_KEY``) where it gives them, and vLLM's default max_tokens (the context the prompt
    leaves); its other vLLM flags have no Tessera meaning.
Nothing else of the tests changes.
"""

from __future__ import annotations

import os
import subprocess
import time

TARGET = os.environ["TESSERA_VLLM_TESTS_TARGET"]  # "tessera" or "vllm"
MODEL_DIR = os.environ["TESSERA_VLLM_TESTS_MODEL"]  # what the target loads
TESSERA_ROOT = os.environ.get("TESSERA_VLLM_TESTS_ROOT", "")
TESSERA_PYTHON = os.environ.get("TESSERA_VLLM_TESTS_PYTHON", "")
LOG_PATH = os.environ.get("TESSERA_VLLM_TESTS_SERVER_LOG", os.devnull)
START_TIMEOUT_S = 900.0


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None


def pytest_configure(config) -> None:
    from tests import utils

    server = utils.RemoteOpenAIServer
    original_init = server.__init__

    def __init__(self, model: str, vllm_serve_args: list[str], **kwargs) -> None:
        self.served_name = model
        extra = ["--served-model-name", model]
        if TARGET == "vllm":
            extra += ["--dtype", "float32", "--skip-mm-profiling"]
        kwargs["max_wait_seconds"] = START_TIMEOUT_S
        original_init(self, MODEL_DIR, [*vllm_serve_args, *extra], **kwargs)

    server.__init__ = __init__
    if TARGET != "tessera":
        return

    def _start_server(self, model: str, vllm_serve_args: list[str], env_dict: dict[str, str] | None) -> None:
        command = [TESSERA_PYTHON, "-m", "services.cli.main", "serve", "--model", model, "--port", str(self.port)]
        command += ["--served-model-name", self.served_name]
        if (max_model_len := _flag(vllm_serve_args, "--max-model-len")) is not None:
            command += ["--max-model-len", max_model_len]
        # vLLM's default max_tokens is what the prompt leaves of the context; Tessera's default
        # (256) shrinks to that, so a default as long as any context is vLLM's.
        command += ["--default-max-tokens", str(2**31 - 1)]
        if "--enable-force-include-usage" in vllm_serve_args:
            command += ["--enable-force-include-usage", "true"]
        if (max_logprobs := _flag(vllm_serve_args, "--max-logprobs")) is not None:
            command += ["--max-logprobs", max_logprobs]
        if (root_path := _flag(vllm_serve_args, "--root-path")) is not None:
            command += ["--root-path", root_path]
        if api_key := (env_dict or {}).get("VLLM_API_KEY"):  # vLLM's key from its environment
            command += ["--api-key", api_key]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | dict(env_dict or {})
        with open(LOG_PATH, "ab") as log:
            self.proc = subprocess.Popen(command, cwd=TESSERA_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_for_server(self, *, url: str, timeout: float) -> None:
        # vLLM's own wait spins without pause while /health answers 503 (Tessera's, until every
        # role has a live node): on 2 cores that slows the start it waits for.
        import requests

        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if requests.get(url, timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {LOG_PATH}")
            time.sleep(1.0)
        raise RuntimeError("Server failed to start in time.")

    server._start_server = _start_server
    server._wait_for_server = _wait_for_server
