"""Config agreement on a real stack (shared/index/cluster_config.py): a node started by hand with
another block size than the running cluster's is refused when it registers. Its process exits
with EXIT_REFUSED and its log names the setting, its value and the cluster's, and it never
becomes a member: no reader sees it, and the cluster keeps its own settings."""

from __future__ import annotations

import subprocess

from services.stack.node_process import start_node
from shared.index.cluster_config import EXIT_REFUSED


def test_a_node_with_another_block_size_is_refused_with_the_reason(stack, tiny_model, tmp_path):
    prefix = f"tessera:{tiny_model.model_id}:"
    with stack.redis_client() as raw:
        assert raw.hgetall(prefix + "config") == {"block_size": "16", "dtype": "float32"}
        members_before = raw.smembers(prefix + "nodes")
    log_path = tmp_path / "decode-odd.log"
    with open(log_path, "w") as log:
        process, grpc_address = start_node(
            "decode", model="tiny", index_url=stack.state()["valkey"]["url"], log=log, extra=("--block-size", "32"), env=stack.node_env()
        )
        try:
            returncode = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    text = log_path.read_text()
    assert returncode == EXIT_REFUSED, text[-3000:]
    assert f"node 'decode@{grpc_address}' refused by the cluster '{tiny_model.model_id}'" in text, text[-3000:]
    assert "its block_size is 32, the cluster's is 16" in text
    assert "Traceback" not in text  # one clear line, not a crash
    with stack.redis_client() as raw:
        assert raw.smembers(prefix + "nodes") == members_before
        assert raw.hgetall(prefix + "config") == {"block_size": "16", "dtype": "float32"}
    assert grpc_address not in {n.info.grpc_address for n in stack.index(tiny_model.model_id).live_nodes().values()}
