"""How long ago this process started, for start-up figures: a node says it serves "after N s",
counted from its own process's start (fork and exec, interpreter and imports included), which
no marker set in Python can see. Read from /proc (Linux); None elsewhere."""

from __future__ import annotations

import os


def seconds_since_start() -> float | None:
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # The process's name (field 2) may hold spaces: fields are counted after its ')'.
            fields = stat.read().rsplit(")", 1)[1].split()
            started_ticks = int(fields[19])  # field 22, starttime, in clock ticks since boot
            return float(uptime.read().split()[0]) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
