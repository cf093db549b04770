"""The benchmarks' local stack: the same helpers `tessera bench` uses (services/bench/local_stack.py)."""

from services.bench.local_stack import launch, scrape_metrics, start_stack, stop_stack, wait_healthy

__all__ = ["launch", "scrape_metrics", "start_stack", "stop_stack", "wait_healthy"]
