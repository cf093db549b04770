#!/usr/bin/env bash
# README command 1: install what is needed and start the whole stack on its embedded defaults:
# an embedded Valkey, one process per role (preprocess, encoder, prefill, decode), and the
# gateway on http://127.0.0.1:8000 (OpenAI API) and 127.0.0.1:50051 (gRPC Generate), serving the
# built-in tiny model (built on first use). Ctrl-C stops everything. Extra arguments go to
# `tessera serve` (for example --model small).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/deploy/bootstrap.sh"
cd "$root"
exec tessera serve "$@"
