"""Transport: ZMQ for bulk tensors (data plane) and gRPC helpers (control plane)."""
