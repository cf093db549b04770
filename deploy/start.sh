#!/usr/bin/env bash
# README command 1: install what is needed, build the built-in model, and run Tessera on an example.
# Until the service stack lands (issue 4), this runs the preprocessing pipeline end to end.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/deploy/bootstrap.sh"
cd "$root"
tessera preprocess --model "${TESSERA_MODEL:-tiny}" "${1:-deploy/examples/chat_request.json}"
