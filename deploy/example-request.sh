#!/usr/bin/env bash
# Send the example image request to a running stack (README): prints the OpenAI JSON response.
# MODEL=NAME names the served model (default: tiny).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
url="${1:-http://127.0.0.1:8000/v1/chat/completions}"
python3 - "$root/deploy/examples/chat_request.json" <<'PY' | curl -sS -H 'Content-Type: application/json' --data-binary @- "$url"
import json, os, sys
body = json.load(open(sys.argv[1]))
body.update(model=os.environ.get("MODEL", "tiny"), max_tokens=16, temperature=0)
print(json.dumps(body))
PY
echo
