#!/usr/bin/env bash
# README command 1: install what is needed, build the built-in model on first use, and run Tessera
# on an example: preprocessing (token ids, placeholder ranges, mm_hashes), then generation.
# Until the service stack lands (issue 4), this is the single-process engine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/deploy/bootstrap.sh"
cd "$root"
model="${TESSERA_MODEL:-tiny}"
echo "== tessera preprocess --model $model deploy/examples/chat_request.json" >&2
tessera preprocess --model "$model" deploy/examples/chat_request.json
echo "== tessera generate --model $model --image deploy/examples/example.png --prompt 'What is in this image?' --json" >&2
tessera generate --model "$model" --image deploy/examples/example.png --prompt "What is in this image?" --max-tokens 16 --json
