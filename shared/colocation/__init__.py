"""Roles sharing one host's cores (the local launcher's stack): each process's share of the CPUs
(cpu_budget.py), the board on which encoder and prefill nodes post their queues
(host_backlog.py), and the pace a decode node keeps while first-token work waits on it
(step_pacing.py, whose numbers are the decode role's settings). A node on cores of its own, or on
a host of its own, uses none of it."""
