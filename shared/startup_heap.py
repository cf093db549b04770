"""Python's cyclic garbage collector in a long-running server: the startup heap set aside.

Why: a server's process holds millions of objects from start-up (imported modules, FastAPI's and
pydantic's schemas, gRPC, a tokenizer, a model's Python side) that live as long as it does. Every
collection of the oldest generation walks all of them, and under many concurrent streams those
collections come often (docs/benchmarks.md, "The collector and the startup heap" has the
gateway's numbers). ``gc.freeze`` moves every object alive
now into a generation the collector never walks, so collections cost in proportion to what the
requests allocate. vLLM's API server and engine core do the same after start-up.

What it costs: a cycle among start-up objects that becomes garbage later is never collected (the
start-up heap is not expected to shrink). Call once per process, after start-up and before
serving; later calls freeze whatever lives then too.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect start-up's garbage, then exclude every surviving object from future collections;
    returns how many objects are now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
