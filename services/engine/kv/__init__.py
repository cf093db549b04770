"""Paged KV cache: the block pool and the per-request KV cache manager."""
