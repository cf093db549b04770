"""The decode role: continuous batching over KV pages received from prefill nodes."""
