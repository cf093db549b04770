#!/usr/bin/env bash
# README command 2: install what is needed and run the default test suite (slow tests excluded;
# run them with: deploy/run-tests.sh -m slow). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/deploy/bootstrap.sh"
cd "$root"
exec python -m pytest "$@"
