#!/usr/bin/env bash
# README command 2: install what is needed and run every test: node kills, multi-host runs per
# family, the compose file as processes; the podman image test too when the image's inputs changed
# since its last verified run (docs/testing.md). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/deploy/bootstrap.sh"
# The index conformance suite also runs against Debian's redis-server; install it where we can.
if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null 2>&1 \
    || echo "note: could not install redis-server; its conformance tests will be skipped" >&2
fi
# The multi-host tests put each role in a network namespace of its own (ip netns, as root).
if ! command -v ip >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2) >/dev/null 2>&1 \
    || echo "note: could not install iproute2; the multi-host tests will be skipped" >&2
fi
# The oracle tests compare with transformers' own processors running with real torchvision, in
# an environment of their own (built once, then reused).
source "$root/deploy/reference-venv.sh"
cd "$root"
select=()
if ! python -m tests.deploy.image_inputs; then
  select=(-m "image or not image")
fi
exec python -m pytest --durations=25 "${select[@]}" "$@"
