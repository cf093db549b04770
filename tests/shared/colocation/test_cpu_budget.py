"""Each process's CPU share: quota detection, the colocated plan, and precedence of operator
settings (pure logic, on temporary cgroup files)."""

from __future__ import annotations

from shared.colocation.cpu_budget import CpuShare, apply_before_torch, available_cpus, cgroup_cpu_limit, plan_shares, share_for_this_node


def test_cgroup_v2_quota_in_cpus(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_cgroup_v1_quota_in_cpus(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000")
    assert cgroup_cpu_limit(tmp_path) == 4.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_cpu_limit(tmp_path) is None


def test_no_cgroup_files_means_no_limit(tmp_path):
    assert cgroup_cpu_limit(tmp_path) is None


def test_available_cpus_is_the_affinity_capped_by_the_quota_rounded_down():
    assert available_cpus(affinity=range(64), limit=2.0) == 2
    assert available_cpus(affinity=range(64), limit=1.5) == 1
    assert available_cpus(affinity=range(64), limit=0.25) == 1
    assert available_cpus(affinity=range(4), limit=None) == 4
    assert available_cpus(affinity=range(4), limit=16.0) == 4


def stack_roles(**counts: int) -> dict[str, str]:
    return {(role if i == 0 else f"{role}-{i}"): role for role, n in counts.items() for i in range(n)}


def test_oversubscribed_compute_roles_each_get_every_core_with_no_pinning():
    shares = plan_shares(stack_roles(preprocess=1, encoder=1, prefill=1, decode=1), [0, 1], pin=True)
    assert {name: share.num_threads for name, share in shares.items()} == {"preprocess": 1, "encoder": 2, "prefill": 2, "decode": 2}
    assert all(share.cpus is None and share.wait_policy == "PASSIVE" for share in shares.values())
    two_of_each = plan_shares(stack_roles(encoder=2, prefill=2, decode=2), [0, 1, 2, 3])
    assert [two_of_each[name].num_threads for name in ("encoder", "prefill-1", "decode", "decode-1")] == [4, 4, 4, 4]
    fits = plan_shares(stack_roles(encoder=1, prefill=1, decode=1), [0, 1, 2])  # one core each: no sharing
    assert [fits[name].num_threads for name in ("encoder", "prefill", "decode")] == [1, 1, 1]


def test_compute_roles_split_the_cpus_and_pin_to_disjoint_cores_when_asked():
    shares = plan_shares(stack_roles(preprocess=2, encoder=1, prefill=1, decode=1), list(range(16)), pin=True)
    assert shares["preprocess"] == shares["preprocess-1"] == CpuShare(num_threads=1)
    compute = [shares[name] for name in ("encoder", "prefill", "decode")]
    assert [share.num_threads for share in compute] == [5, 5, 5]
    cores = [core for share in compute for core in share.cpus]
    assert len(cores) == len(set(cores)) == 15
    unpinned = plan_shares(stack_roles(encoder=1, prefill=1, decode=1), list(range(16)))
    assert all(share.cpus is None for share in unpinned.values())


def test_a_lone_node_takes_its_quota_and_operator_variables_win(monkeypatch):
    monkeypatch.setattr("shared.colocation.cpu_budget.cgroup_cpu_limit", lambda: 1.0)
    assert share_for_this_node("decode", env={}) == CpuShare(num_threads=1)
    assert share_for_this_node("preprocess", env={}).num_threads == 1
    chosen = share_for_this_node("encoder", env={"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE", "TESSERA_CPU_AFFINITY": "2,3"})
    assert chosen == CpuShare(num_threads=3, wait_policy="ACTIVE", cpus=(2, 3))
    assert share_for_this_node("encoder", env={"OMP_NUM_THREADS": "zero"}).num_threads == 1


def test_applying_a_share_never_overrides_what_is_set():
    env = {"OMP_NUM_THREADS": "7"}
    apply_before_torch(CpuShare(num_threads=2), env)
    assert env == {"OMP_NUM_THREADS": "7", "MKL_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
