"""The gateway: OpenAI-compatible HTTP API and the public gRPC Generate service, over the
preprocess -> encoder -> prefill -> decode pipeline."""
