"""The local stack's zygote: one process that loads what every node loads, then forks the nodes.

Why: each node of a local stack used to start as a fresh interpreter and import torch,
transformers, gRPC and its role's modules, then read the checkpoint's config and tokenizer:
seconds of CPU per node, repeated by every node while they all share a few cores. The zygote
does that once; a node forked from it starts with it all in memory (shared copy-on-write) and
goes straight to its own work: weights, kernels, its server. A role restarted after a crash is
forked the same way, so its gap is short too.

Fork safety, the invariants this module keeps:
- The zygote never computes, never opens a gRPC channel or server, an event loop, a socket or a
  file a node would inherit, and starts no thread. It checks the last before it says it is
  ready (OpenBLAS, loaded by NumPy, would start one: it is told to use one thread); a zygote
  with any other thread refuses, and the launcher starts its nodes the ordinary way.
- What libraries read only as they load (OpenMP's wait policy, the C allocator's variables,
  the dynamic loader's) is the zygote's for every node it forks. The launcher forks a node
  only if its environment agrees with the zygote's on those (``forkable``); otherwise it
  starts that node as a new process. The number of threads is set at run time by every node
  (shared/colocation/cpu_budget.py), so shares may differ.
- A forked node gets the environment and arguments its own process would have had, a session
  of its own, and SIGTERM when the zygote dies (which dies with the launcher).

Wire: the launcher writes one JSON line per request to the zygote's control pipe, which the
zygote handles in order: a fork ({"argv", "env"}), answered {"pid"}, or the tokenizer's preload
({"preload": "tokenizer"}), answered {"preloaded": error or null}; the tokenizer comes last
because encoders need none and are forked before it. The zygote says {"ready"} or {"error"} once
it has preloaded the rest, and reports {"exited": pid, "returncode"} when it reaps a node (as
``subprocess.Popen.returncode``: negative for a signal).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

# Variables read once as a library loads, not at each use: a node's value must equal the zygote's.
_LOAD_TIME_PREFIXES = ("OMP_WAIT_POLICY", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_", "KMP_", "MALLOC_", "LD_", "PYTHON", "OPENBLAS_")
ZYGOTE_ENV = {"OPENBLAS_NUM_THREADS": "1"}  # NumPy's BLAS would otherwise start a thread at import
START_TIMEOUT_S = 120.0
FORK_REPLY_TIMEOUT_S = 60.0  # a fork queued behind a preload waits for it


def _load_time(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_LOAD_TIME_PREFIXES)}


# -- the zygote process ---------------------------------------------------------------------
def _preload(model: str) -> Path:
    """Import and read what every node would, in the order a node does; the checkpoint's path."""
    import importlib

    import torch  # noqa: F401  (OpenMP loads here, with the zygote's wait policy)

    from services.cli.main import build_parser
    from services.models.registry import resolve_model
    from services.stack.roles import ROLE_TO_MODULE, TENSOR_FREE_ROLES

    for role, module in ROLE_TO_MODULE.items():
        if role not in TENSOR_FREE_ROLES:
            importlib.import_module(module)
    build_parser()  # what every node's command line imports
    ref = resolve_model(model)
    ref.family.read_config(ref.path)  # transformers' config classes, imported and warm
    # The processor side (transformers' processing and image-processing modules): seconds of
    # imports that preprocess nodes, and encoders measuring their tower, would each pay.
    from transformers import ProcessorMixin

    from services.models.family import ImageOptions

    ProcessorMixin.get_processor_dict(str(ref.path))
    ref.family.image_processor(ref.path, ImageOptions())
    return ref.path


def _preload_tokenizer(model_dir: Path) -> str | None:
    """The tokenizer, for the nodes forked from now on (a failure: each loads its own); the error."""
    from services.models.tokenizer import preload_tokenizer

    try:
        preload_tokenizer(model_dir)
    except Exception as exc:
        return repr(exc)
    return None


def _num_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _send(out_fd: int, message: dict) -> None:
    os.write(out_fd, (json.dumps(message) + "\n").encode())


def _run_child(argv: list[str], env: dict[str, str], control_fds: tuple[int, int]) -> None:
    """In the forked node: become the process ``tessera ARGV`` would have been; never returns."""
    code = 1
    try:
        for fd in control_fds:
            os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL if sig != signal.SIGPIPE else signal.SIG_IGN)
        from services.stack.node_process import detach_but_die_with_parent

        detach_but_die_with_parent()
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["tessera", *argv]
        from services.cli.main import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream: nothing left to flush
                pass
        os._exit(code)


def serve(model: str, in_fd: int, out_fd: int) -> None:
    """The zygote's loop: fork on request, reap and report; ends when the launcher's pipe closes."""
    try:
        model_dir = _preload(model)
    except Exception as exc:  # the launcher starts its nodes the ordinary way
        _send(out_fd, {"error": f"preloading failed: {exc!r}"})
        return
    if _num_threads() != 1:
        _send(out_fd, {"error": f"the zygote has {_num_threads()} threads after preloading; forking it is not safe"})
        return
    _send(out_fd, {"ready": True})
    buffer = b""
    while True:
        readable, _, _ = select.select([in_fd], [], [], 0.2)
        _reap(out_fd)
        if not readable:
            continue
        data = os.read(in_fd, 1 << 16)
        if not data:
            return  # the launcher is gone; our nodes get SIGTERM as we exit
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            if request.get("preload") == "tokenizer":
                _send(out_fd, {"preloaded": _preload_tokenizer(model_dir)})
                continue
            if _num_threads() != 1:  # something preloaded since started a thread
                _send(out_fd, {"refused": f"the zygote has {_num_threads()} threads; forking it is not safe"})
                continue
            pid = os.fork()
            if pid == 0:
                _run_child(request["argv"], request["env"], (in_fd, out_fd))
            _send(out_fd, {"pid": pid})


def _reap(out_fd: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(out_fd, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})


# -- the launcher's side ----------------------------------------------------------------------
class ZygoteRefusedError(RuntimeError):
    """The zygote would not fork (it is no longer safe to); start the node as a new process."""


class ForkedNode:
    """A node forked by the zygote, with the part of ``subprocess.Popen``'s interface the launcher
    uses. Its exit is learnt from the zygote (its parent), which reaps it."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None
        self.args = ["<forked>", str(pid)]

    def poll(self) -> int | None:
        if self.returncode is None:
            self._zygote.pump()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            if not self._zygote.alive():
                # Our nodes died with the zygote (SIGTERM); nobody is left to report them.
                self.returncode = -signal.SIGTERM
                break
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The launcher's handle on its zygote process."""

    def __init__(self, model: str, env: Mapping[str, str]) -> None:
        self.env = {**env, **ZYGOTE_ENV}
        to_zygote_read, self._to_zygote = os.pipe()
        self._from_zygote, from_zygote_write = os.pipe()
        from services.stack.node_process import detach_but_die_with_parent

        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.stack.zygote", model, str(to_zygote_read), str(from_zygote_write)],
            env=self.env,
            pass_fds=(to_zygote_read, from_zygote_write),
            preexec_fn=detach_but_die_with_parent,
            cwd=Path(__file__).resolve().parents[2],
        )
        os.close(to_zygote_read)
        os.close(from_zygote_write)
        os.set_blocking(self._from_zygote, False)
        self._buffer = b""
        self._nodes: dict[int, ForkedNode] = {}
        self._replies: list[dict] = []
        self.ready = False
        self.error: str | None = None
        self._closed = False

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """True once the zygote has preloaded; False (with ``error``) if it cannot fork nodes."""
        deadline = time.monotonic() + timeout_s
        while not self.ready and self.error is None:
            if time.monotonic() >= deadline:
                self.error = f"not ready within {timeout_s:.0f} s"
            elif not self.alive():
                self.error = f"exited with {self.process.returncode} while preloading"
            else:
                self.pump(wait_s=0.05)
        if self.error is not None:
            self.close()
        return self.ready and self.error is None

    def alive(self) -> bool:
        return self.process.poll() is None

    def forkable(self, env: Mapping[str, str]) -> bool:
        """Whether a node with ``env`` may be forked: it agrees on every load-time variable."""
        usable = self.ready and self.error is None and not self._closed and self.alive()
        return usable and _load_time({**env, **ZYGOTE_ENV}) == _load_time(self.env)

    def preload_tokenizer(self) -> None:
        """Have the zygote load the tokenizer before the forks asked for after this: nodes that
        need none (encoders) are best forked before, and start meanwhile."""
        os.write(self._to_zygote, (json.dumps({"preload": "tokenizer"}) + "\n").encode())

    def fork(self, argv: list[str], env: Mapping[str, str]) -> ForkedNode:
        """A node running ``tessera ARGV`` (``argv`` without the interpreter and module)."""
        os.write(self._to_zygote, (json.dumps({"argv": argv, "env": {**env, **ZYGOTE_ENV}}) + "\n").encode())
        deadline = time.monotonic() + FORK_REPLY_TIMEOUT_S
        while not self._replies:
            if not self.alive() or time.monotonic() >= deadline:
                raise RuntimeError("the zygote did not answer a fork request")
            self.pump(wait_s=0.05)
        reply = self._replies.pop(0)
        if "refused" in reply:
            self.error = reply["refused"]
            raise ZygoteRefusedError(reply["refused"])
        node = ForkedNode(self, reply["pid"])
        self._nodes[node.pid] = node
        self.pump()  # an exit reported before the reply was read
        return node

    def pump(self, wait_s: float = 0.0) -> None:
        """Read what the zygote said: readiness, fork replies and exits."""
        if self._closed:
            return
        if wait_s > 0:
            select.select([self._from_zygote], [], [], wait_s)
        try:
            while chunk := os.read(self._from_zygote, 1 << 16):
                self._buffer += chunk
        except (BlockingIOError, OSError):
            pass
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "exited" in message:
                node = self._nodes.pop(message["exited"], None)
                if node is not None:
                    node.returncode = message["returncode"]
            elif "pid" in message or "refused" in message:
                self._replies.append(message)
            elif "ready" in message:
                self.ready = True
            elif "error" in message:
                self.error = message["error"]
            elif message.get("preloaded") is not None:
                print(f"the zygote could not preload the tokenizer ({message['preloaded']}); each node loads its own", file=sys.stderr)

    def close(self) -> None:
        """Stop the zygote (its nodes, if any are left, get SIGTERM as it exits)."""
        if self._closed:
            return
        self._closed = True
        os.close(self._to_zygote)  # the zygote reads the end of its pipe and exits
        os.close(self._from_zygote)
        if self.alive():
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
