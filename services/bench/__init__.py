"""``tessera bench``: named workloads against the local stack or any OpenAI-compatible endpoint."""
