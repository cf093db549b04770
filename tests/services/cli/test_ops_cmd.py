"""``tessera health`` and ``tessera drain``: the probe and the preStop hook containers run."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.cli.main import main
from services.stack.node_process import free_port


def test_health_is_0_only_while_the_server_answers_serving():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    server.start()
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert main(["health", address]) == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)  # draining
        assert main(["health", address]) == 1
    finally:
        server.stop(None)
    assert main(["health", address, "--timeout-s", "0.5"]) == 1  # gone


def test_drain_sends_sigterm_and_waits_for_the_process_to_exit():
    script = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nprint('ready', flush=True)\ntime.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    reaper = threading.Thread(target=process.wait)  # as init would: an exited child is reaped
    reaper.start()
    assert main(["drain", "--pid", str(process.pid), "--timeout-s", "10"]) == 0
    reaper.join(timeout=5)
    assert process.returncode == 0
