"""``tessera serve``: start the whole local stack and supervise it.

Order: embedded Valkey (the index server, unless --index-url names one) -> every role at once,
each its own OS process wired as in a real deployment: nodes register their advertised addresses
in the index and the gateway discovers them there (no address lists are passed around), so a node
started later by hand with the same --index-url joins by itself. The gateway reports not ready
until a node of every role it routes to has registered; the launcher waits for each role's gRPC
health check. Nodes are forked by a zygote (zygote.py) that loaded what they all load, unless
--no-zygote. A role that dies is restarted (short backoff) on the same ports; requests in the gap
fail fast with 503. So is the embedded Valkey, on the same port and empty: the nodes serve from
their local caches meanwhile, then register under a new epoch and republish what they hold. Ctrl-C
(SIGINT) or SIGTERM stops the roles in reverse order, then Valkey."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.router.scoring import EncodeDispatch, default_encode_dispatch
from services.stack.node_process import ServerExitedError, detach_but_die_with_parent, free_port, wait_serving
from services.stack.roles import ENV_PREFIX
from services.stack.zygote import ForkedNode, Zygote, ZygoteRefusedError
from services.transport.index_access import PASSWORD_ENV
from services.transport.internal_auth import SECRET_ENV
from shared.colocation import host_backlog
from shared.colocation.cpu_budget import COMPUTE_ROLES, CpuShare, available_cpus, cgroup_cpu_limit, cores_shared, plan_shares
from shared.index.cluster_config import EXIT_REFUSED

INTERNAL_HOST = "127.0.0.1"  # where the local stack's internal ports listen
NO_TOKENIZER_ROLES = frozenset({"encoder"})


def _role_of(role: RoleProcess) -> str:
    return role.role.split("-")[0]


def _move_internal_ports(role: RoleProcess) -> None:
    """Give a node that has not served yet new internal ports (the gateway's are the user's)."""
    for flag, scheme in (("--grpc-address", ""), ("--data-address", "tcp://")):
        if flag in role.argv:
            at = role.argv.index(flag) + 1
            role.argv[at] = f"{scheme}{INTERNAL_HOST}:{free_port()}"
            if flag == "--grpc-address":
                role.grpc_address = role.argv[at]


@dataclass(slots=True)
class RoleProcess:
    role: str
    argv: list[str]
    grpc_address: str
    process: subprocess.Popen | ForkedNode | None = None
    num_restarts: int = 0


@dataclass(slots=True)
class StackConfig:
    model: str = "tiny"
    host: str = "127.0.0.1"
    http_port: int = 8000
    generate_port: int = 50051
    index_url: str = ""  # an external Redis/Valkey; empty: start the embedded Valkey
    restart_roles: bool = True
    state_file: Path | None = None
    startup_timeout_s: float = 300.0
    num_preprocess: int = 1
    num_encoders: int = 1
    num_prefill: int = 1
    num_decode: int = 1
    routing_policy: str = "cache_aware"
    runner: str = "generate"  # the gateway's --runner; "pooling" starts no decode node, whatever num_decode says
    passthrough: list[str] = field(default_factory=list)  # engine / preprocess flags for the roles
    pin_cpus: bool = False  # pin each compute role to its own cores when their shares fit
    zygote: bool = True  # fork the nodes from one process that loaded their common imports (zygote.py)


DISPATCH_ENV = f"{ENV_PREFIX}ENCODE_DISPATCH"
LOCAL_ENCODE_ENV = f"{ENV_PREFIX}LOCAL_ENCODE"


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.roles: list[RoleProcess] = []
        self.valkey: subprocess.Popen | None = None
        self.valkey_url = ""
        self.valkey_port = 0
        self.valkey_restarts = 0
        self._valkey_retry_at = 0.0
        self._stopping = False
        self.cpu_shares: dict[str, CpuShare] = {}
        self.cores_shared = False  # the compute roles outnumber the cores (set with the CPU shares)
        # The host's backlog board (shared/colocation/host_backlog.py), made with the CPU shares; None: none.
        self.backlog_board: Path | None = None
        self.board_slots: dict[str, int | None] = {}
        # One internal secret per stack (services/transport/internal_auth.py), handed to every role
        # through its environment, never its command line; a configured one is kept.
        self.internal_secret = os.environ.get(SECRET_ENV) or secrets.token_urlsafe(32)
        # The embedded Valkey's password, handed to the roles the same way; with --index-url, the
        # roles read the operator's own (TESSERA_INDEX_PASSWORD or --index-password-file).
        self.index_password = os.environ.get(PASSWORD_ENV) or secrets.token_urlsafe(32)
        self.zygote: Zygote | None = None

    def start(self) -> None:
        from services.models.hub import parse_hub_reference, pinned_reference
        from services.models.registry import resolve_model

        # Build a missing built-in, or download a Hub checkpoint, once, before the roles start;
        # the roles then load a Hub checkpoint at the commit downloaded here, from the cache.
        resolved = resolve_model(self.config.model)
        hub = parse_hub_reference(self.config.model)
        model = str(pinned_reference(hub, resolved.path)) if hub is not None else self.config.model
        if self.config.index_url:
            self.valkey_url = self.config.index_url
        else:
            self._start_valkey()
        base = [sys.executable, "-m", "services.cli.main", "serve", "--model", model, "--index-url", self.valkey_url]
        self.roles.extend(self.node_processes(base))
        self._plan_cpus()
        self._leave_idle_towers_unloaded()
        gateway = self._gateway_process(base)
        self.roles.append(gateway)
        self._spawn_all(model, gateway)
        for role in self.roles:
            self._wait_started(role)
        self._write_state()
        url = f"http://{self.config.host}:{self.config.http_port}/v1"
        print(f"tessera is serving {self.config.model} at {url} (gRPC Generate on {gateway.grpc_address})", flush=True)

    def _gateway_process(self, base: list[str]) -> RoleProcess:
        address = f"{self.config.host}:{self.config.generate_port}"
        argv = [*base, "--role", "gateway", "--http-host", self.config.host, "--http-port", str(self.config.http_port)]
        argv += ["--generate-address", address, "--routing-policy", self.config.routing_policy, "--runner", self.config.runner]
        argv += self._encode_dispatch_flags()
        return RoleProcess("gateway", [*argv, *self.config.passthrough], address)

    def _spawn_all(self, model: str, gateway: RoleProcess) -> None:
        """Every role at once, the gateway too: it reports not ready (/ready, /health: 503) until a
        node of every role has registered, so nothing waits in turn. The zygote forks the nodes once
        it loaded what they all load (encoders before the tokenizer, which they do not need)."""
        nodes = [role for role in self.roles if role is not gateway]
        if self.config.zygote:
            self.zygote = Zygote(model, self._env_for(nodes[0]))
        self._spawn(gateway)
        if self.zygote is not None and not self.zygote.wait_ready():
            print(f"the zygote cannot fork nodes ({self.zygote.error}); starting each node on its own", file=sys.stderr, flush=True)
        for role in nodes:
            if _role_of(role) in NO_TOKENIZER_ROLES:
                self._spawn(role)
        if self.zygote is not None and self.zygote.forkable(self._env_for(nodes[0])):
            self.zygote.preload_tokenizer()
        for role in nodes:
            if _role_of(role) not in NO_TOKENIZER_ROLES:
                self._spawn(role)

    def node_processes(self, base: list[str]) -> list[RoleProcess]:
        """The preprocess, encoder, prefill and decode processes to start. Their ports bind loopback
        whatever ``--host`` says: the stack is one machine; only the gateway's APIs face outside."""
        config = self.config
        decode = {} if config.runner == "pooling" else {"decode": config.num_decode}  # an embedding never reaches one
        counts = dict(preprocess=config.num_preprocess, encoder=config.num_encoders, **decode, prefill=config.num_prefill)
        if min(counts.values()) < 1:
            raise ValueError("every role needs at least one node")
        # Nothing binds until the nodes start: without this a draw could repeat another's port,
        # or the gateway's (which the caller may have drawn the same way).
        processes, taken = [], {self.config.http_port, self.config.generate_port}

        def draw() -> int:
            port = free_port(taken)
            taken.add(port)
            return port

        for role, count in counts.items():
            for i in range(count):
                grpc_address = f"{INTERNAL_HOST}:{draw()}"
                extra = ["--grpc-address", grpc_address]
                if role != "preprocess":
                    extra += ["--data-address", f"tcp://{INTERNAL_HOST}:{draw()}"]
                name = role if i == 0 else f"{role}-{i}"
                processes.append(RoleProcess(name, [*base, "--role", role, *extra, *self.config.passthrough], grpc_address))
        return processes

    def _wait_started(self, role: RoleProcess, max_attempts: int = 3) -> None:
        """Wait for ``role`` to serve; a process that dies while starting (a port taken in the
        meantime, a crash) is started again, at most ``max_attempts`` times in all."""
        for attempt in range(1, max_attempts + 1):
            try:
                wait_serving(role.grpc_address, self.config.startup_timeout_s, role.process)
                return
            except ServerExitedError as exc:
                if attempt == max_attempts:
                    raise
                print(f"{role.role}: {exc}; starting it again", file=sys.stderr, flush=True)
                _move_internal_ports(role)  # another process may hold the ports it drew: draw new ones
                self._spawn(role)

    def supervise(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop())
        signal.signal(signal.SIGINT, lambda *_: self._request_stop())
        while not self._stopping:
            self._check_valkey()
            for role in self.roles:
                if role.process is not None and role.process.poll() is not None and not self._stopping:
                    print(f"{role.role} (pid {role.process.pid}) exited with {role.process.returncode}", file=sys.stderr, flush=True)
                    if role.process.returncode == EXIT_REFUSED:  # its settings disagree with the cluster's: a restart would too
                        print(f"{role.role} was refused by the cluster (its log says why); not restarting it", file=sys.stderr, flush=True)
                        role.process = None
                    elif self.config.restart_roles:
                        time.sleep(min(5.0, 0.5 * 2 ** min(role.num_restarts, 3)))
                        role.num_restarts += 1
                        self._spawn(role)
                        self._write_state()
            time.sleep(0.2)
        self.stop()

    def stop(self) -> None:
        self._stopping = True
        for role in reversed(self.roles):
            if role.process is not None and role.process.poll() is None:
                role.process.send_signal(signal.SIGTERM)
        for role in reversed(self.roles):
            if role.process is not None:
                try:
                    role.process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    role.process.kill()
        if self.zygote is not None:
            self.zygote.close()
        if self.backlog_board is not None:
            self.backlog_board.unlink(missing_ok=True)
        if self.valkey is not None and self.valkey.poll() is None:
            self.valkey.terminate()
            try:
                self.valkey.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.valkey.kill()

    def _request_stop(self) -> None:
        self._stopping = True

    def _spawn(self, role: RoleProcess) -> None:
        env = self._env_for(role)
        if role.role != "gateway" and self.zygote is not None and self.zygote.forkable(env):
            try:
                role.process = self.zygote.fork(role.argv[3:], env)  # argv without "python -m services.cli.main"
                return
            except ZygoteRefusedError as exc:
                print(f"the zygote refused to fork {role.role} ({exc}); starting nodes on their own", file=sys.stderr, flush=True)
        role.process = subprocess.Popen(role.argv, env=env, preexec_fn=detach_but_die_with_parent)

    def _env_for(self, role: RoleProcess) -> dict[str, str]:
        # The role's CPU share first, so a variable the operator set wins over it.
        env = {**self._cpu_share(role).to_env(), **os.environ, "HF_HUB_OFFLINE": "1"}
        if self.backlog_board is not None and role.role in self.board_slots:
            env.update(host_backlog.board_env(self.backlog_board, self.board_slots[role.role]))
        env[SECRET_ENV] = self.internal_secret
        if not self.config.index_url:
            env[PASSWORD_ENV] = self.index_password
        return env

    def _encode_dispatch_flags(self) -> list[str]:
        """The gateway's --encode-dispatch for this host's CPU plan, unless the operator chose one."""
        dispatch = self._default_dispatch()
        return [] if dispatch is None else ["--encode-dispatch", dispatch]

    def _default_dispatch(self) -> EncodeDispatch | None:
        """The encode dispatch this host's CPU plan gives the gateway; None where the operator chose
        one (a flag, or its variable)."""
        return None if self._operator_set("--encode-dispatch", DISPATCH_ENV) else default_encode_dispatch(self.cores_shared)

    def _leave_idle_towers_unloaded(self) -> None:
        """Where the gateway keeps images on the encoder tier, prefill nodes load no vision tower:
        it would serve no request (unless the operator asked for it)."""
        if self._default_dispatch() != EncodeDispatch.ENCODER or self._operator_set("--local-encode", LOCAL_ENCODE_ENV):
            return
        for role in self.roles:
            if role.role.split("-")[0] == "prefill":
                role.argv += ["--local-encode", "0"]

    def _operator_set(self, flag: str, variable: str) -> bool:
        return variable in os.environ or any(arg.split("=", 1)[0] in (flag, f"--no-{flag[2:]}") for arg in self.config.passthrough)

    def _cpu_share(self, role: RoleProcess) -> CpuShare:
        """``role``'s share of the host's CPUs (shared/colocation/cpu_budget.py has the rule)."""
        self._plan_cpus()
        return self.cpu_shares.get(role.role, CpuShare(num_threads=1))

    def _plan_cpus(self) -> None:
        """Each node's share of the CPUs, once the nodes are known."""
        if not self.cpu_shares:
            cpus = sorted(os.sched_getaffinity(0))[: available_cpus(limit=cgroup_cpu_limit())]
            role_of_process = {r.role: r.role.split("-")[0] for r in self.roles if r.role != "gateway"}
            self.cpu_shares = plan_shares(role_of_process, cpus, pin=self.config.pin_cpus)
            num_compute = sum(role in COMPUTE_ROLES for role in role_of_process.values())
            self.cores_shared = cores_shared(num_compute, len(cpus))
            shares_cores = {name: share.cpus is None for name, share in self.cpu_shares.items()}
            self.board_slots = host_backlog.board_roles(role_of_process, shares_cores)
            if self.board_slots:
                self.backlog_board = host_backlog.new_board(sum(slot is not None for slot in self.board_slots.values()))

    def _start_valkey(self) -> None:
        from services.stack.redis_server import embedded_valkey_binary, start_redis_server

        self.valkey_port = self.valkey_port or free_port()  # a restart reuses the port the nodes know
        self.valkey, self.valkey_url = start_redis_server(
            embedded_valkey_binary(), self.valkey_port, password=self.index_password, preexec_fn=detach_but_die_with_parent
        )

    def _check_valkey(self) -> None:
        """Restart a dead embedded Valkey on its port (after the roles' backoff), without blocking
        the roles' supervision meanwhile."""
        if self.valkey is None or self.valkey.poll() is None or not self.config.restart_roles:
            return
        backoff = min(5.0, 0.5 * 2 ** min(self.valkey_restarts, 3))
        if self._valkey_retry_at == 0.0:
            print(f"valkey (pid {self.valkey.pid}) exited with {self.valkey.returncode}", file=sys.stderr, flush=True)
            self._valkey_retry_at = time.monotonic() + backoff
        if time.monotonic() < self._valkey_retry_at:
            return
        try:
            self._start_valkey()
        except RuntimeError as exc:  # e.g. its port was taken meanwhile: try again later
            print(f"valkey restart failed ({exc}); retrying", file=sys.stderr, flush=True)
            self._valkey_retry_at = time.monotonic() + backoff
            return
        self._valkey_retry_at = 0.0
        self.valkey_restarts += 1
        self._write_state()

    def _write_state(self) -> None:
        if self.config.state_file is None:
            return
        state = {
            "valkey": {"url": self.valkey_url, "pid": self.valkey.pid if self.valkey else None, "restarts": self.valkey_restarts},
            "http": f"http://{self.config.host}:{self.config.http_port}",
            "backlog_board": str(self.backlog_board) if self.backlog_board is not None else None,
            "roles": {
                r.role: {"pid": r.process.pid if r.process else None, "grpc_address": r.grpc_address, "restarts": r.num_restarts}
                for r in self.roles
            },
        }
        (tmp := Path(str(self.config.state_file) + ".tmp")).write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.config.state_file)
