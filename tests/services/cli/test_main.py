"""The entry point: what it settles before any subcommand loads."""

from __future__ import annotations


def test_a_role_claims_its_cpu_share_before_anything_imports_torch(monkeypatch):
    from services.cli import main as cli_main

    claimed = []
    monkeypatch.setattr(cli_main.cpu_budget, "apply_before_torch", claimed.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for argv in (["serve", "--role", "decode"], ["serve", "--model", "tiny", "--role=encoder"], ["serve"], ["health", "x"]):
        cli_main._claim_cpu_share(argv)
    assert len(claimed) == 2 and all(share.wait_policy in ("PASSIVE", "ACTIVE") for share in claimed)
