"""glibc keeps freed blocks for reuse in compute processes, unless the operator chose otherwise."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from shared import allocator

GLIBC = platform.libc_ver()[0] == "glibc"


def test_an_operators_malloc_setting_wins():
    assert not allocator.keep_freed_memory({"MALLOC_TRIM_THRESHOLD_": "0"})
    assert not allocator.keep_freed_memory({"MALLOC_MMAP_THRESHOLD_": "65536"})


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    """Blocks of 20 MB, allocated and freed in turns: by default each is unmapped when freed and
    faulted in again; with the thresholds raised its pages stay mapped for the next one."""
    probe = (
        "import resource, sys\n"
        "from shared import allocator\n"
        "assert allocator.keep_freed_memory() == (sys.argv[1] == 'keep') or sys.argv[1] == 'default'\n"
        "blocks = [bytearray(20 << 20) for _ in range(2)]\n"
        "del blocks\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(10):\n"
        "    block = bytearray(20 << 20)\n"
        "    del block\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )

    def faults(mode: str) -> int:
        argv = [sys.executable, "-c", probe if mode == "keep" else probe.replace("allocator.keep_freed_memory()", "False"), mode]
        return int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    kept, default = faults("keep"), faults("default")
    assert kept < default / 10
