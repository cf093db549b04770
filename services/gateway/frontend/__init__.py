"""What every door of the gateway (the HTTP API, gRPC Generate) hands a request to: one Frontend
with the same guards for all of them (frontend.py)."""
