#!/usr/bin/env bash
# The shipped image and compose file, run as a docker-compose user would, with podman and
# podman-compose (no Docker engine and no image registry here). tests/deploy/test_podman_compose.py
# drives it when the image's inputs changed (tests/deploy/image_inputs.py); by hand:
#
#   bash tests/deploy/podman_compose.sh build   # stand-in base images, then deploy/Dockerfile's cpu target
#   bash tests/deploy/podman_compose.sh up      # docker-compose.yml as shipped, --scale encoder=2; prints the gateway's URL
#   bash tests/deploy/podman_compose.sh down    # stop it and drop its volumes
#
# Nothing here changes the Dockerfile or the compose file. What this machine needs is set here:
# - No registry is reachable, so the images the files name come from Debian's packages:
#   * PYTHON_IMAGE: a debootstrap of Debian 12 with its python3 (3.11), pip and venv, tagged
#     localhost/tessera-python-standin:3.11. It differs from python:3.11-slim in: Debian's build
#     of CPython 3.11 (/usr/bin/python3, with python-is-python3 for `python`) instead of
#     python.org's in /usr/local; Debian's pip, whose "externally managed" guard is lifted with
#     PIP_BREAK_SYSTEM_PACKAGES=1 (the slim image has no such guard); no /usr/local Python.
#     Debian's CPython is 3.11.2, and before 3.11.3 redis-py also imports async-timeout, which the
#     lock (resolved on a newer 3.11) leaves out: the stand-in carries Debian's python3-async-timeout.
#   * valkey/valkey:8: the same base with Debian's redis-server and redis-cli under Valkey's
#     command names (the compose file uses only valkey-server's stdin config and valkey-cli ping).
# - The build reaches the package registry through this machine's pip configuration (its wheel
#   directory and CA bundle, mounted into the build), with TORCH_INDEX_URL pointed at the registry:
#   the torch CPU wheel lies in that wheel directory.
# - podman: a containers.conf with the runc runtime and default_ulimits below this host's hard
#   limits; podman-compose 1.6 with --in-pod false.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="${TESSERA_PODMAN_WORK:-/var/tmp/tessera-podman}"
python_image="localhost/tessera-python-standin:3.11"
valkey_image="docker.io/valkey/valkey:8"
project=tessera
mkdir -p "$work"

need_tools() {
  local missing=()
  for tool in podman debootstrap runc; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "needs root to install: ${missing[*]}" >&2; exit 2; }
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah debootstrap runc >/dev/null
  fi
  if ! python -c 'import podman_compose' >/dev/null 2>&1; then python -m pip install -q "podman-compose==1.6.0"; fi
  local nofile nproc
  nofile="$(ulimit -Hn)"; nproc="$(ulimit -Hu)"
  [ "$nofile" = unlimited ] && nofile=1048576
  [ "$nproc" = unlimited ] && nproc=1048576
  # podman's own default nproc exceeds this host's, and runc then fails (EPERM) in every container;
  # 16384 is what a role needs with room to spare (here, a value near half the hard limit failed too).
  local nproc_limit=$(( nproc < 16384 ? nproc : 16384 ))
  cat > "$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$((nofile / 2)):$((nofile / 2))", "nproc=$nproc_limit:$nproc_limit"]
[engine]
runtime = "runc"
EOF
  cat > "$work/pip.conf" <<EOF
[global]
find-links = /opt/wheels
EOF
}
export CONTAINERS_CONF="$work/containers.conf"

registry_mounts() {
  local mounts=(--network host -v "$work/pip.conf:/etc/pip.conf:ro")
  [ -d /opt/wheels ] && mounts+=(-v /opt/wheels:/opt/wheels:ro)
  [ -f /etc/ssl/certs/ca-certificates.crt ] && mounts+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
  printf '%s\n' "${mounts[@]}"
}

build_standins() {
  if ! podman image exists "$python_image"; then
    local rootfs="$work/rootfs"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python-is-python3,python3-async-timeout,ca-certificates \
      bookworm "$rootfs" http://deb.debian.org/debian >"$work/debootstrap.log"
    tar -C "$rootfs" -c . | podman import \
      --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$python_image" >/dev/null
    rm -rf "$rootfs"
  fi
  if ! podman image exists "$valkey_image"; then
    printf '%s\n' "FROM $python_image" \
      "RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server redis-tools && rm -rf /var/lib/apt/lists/* \\" \
      " && ln -s /usr/bin/redis-server /usr/local/bin/valkey-server && ln -s /usr/bin/redis-cli /usr/local/bin/valkey-cli" \
      | podman build --network host -t "$valkey_image" -f - "$work" >/dev/null
  fi
}

build() {
  need_tools
  build_standins
  mapfile -t mounts < <(registry_mounts)
  local start=$SECONDS
  podman build -f "$root/deploy/Dockerfile" --ignorefile "$root/deploy/Dockerfile.dockerignore" --target cpu \
    --build-arg PYTHON_IMAGE="$python_image" --build-arg TORCH_INDEX_URL=https://pypi.org/simple \
    "${mounts[@]}" -t tessera:latest "$root"
  echo "build_s=$((SECONDS - start))"
  podman image inspect tessera:latest --format 'image_bytes={{.Size}}'
}

compose() {
  (cd "$root" && python -m podman_compose --in-pod false -p "$project" -f docker-compose.yml "$@")
}

gateway_url() {
  local container
  container="$(podman ps --filter "label=com.docker.compose.project=$project" --filter "label=com.docker.compose.service=gateway" --format '{{.Names}}' | head -1)"
  [ -n "$container" ] || return 1
  echo "http://$(podman inspect "$container" --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}'):8000"
}

up() {
  need_tools
  local start=$SECONDS
  compose up -d --no-build --scale encoder=2 >"$work/compose-up.log" 2>&1 || { cat "$work/compose-up.log" >&2; exit 1; }
  local url=""
  for _ in $(seq 1 240); do  # bounded: 20 minutes
    url="$(gateway_url || true)"
    if [ -n "$url" ] && python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('$url/health', timeout=5).status != 200)" 2>/dev/null; then
      echo "healthy_s=$((SECONDS - start))"
      echo "gateway_url=$url"
      return 0
    fi
    sleep 5
  done
  echo "the stack did not become healthy" >&2
  podman ps -a --filter "label=com.docker.compose.project=$project" >&2
  exit 1
}

down() {
  need_tools
  compose down -v -t 20 >/dev/null 2>&1 || true
  # podman-compose 1.6 leaves replicas past the first (encoder_2) and one-shot containers behind.
  local label="label=com.docker.compose.project=$project" ids
  ids="$(podman ps -aq --filter "$label")"
  [ -z "$ids" ] || podman rm -f -v --depend -t 20 $ids >/dev/null
  ids="$(podman volume ls -q --filter "$label")"
  [ -z "$ids" ] || podman volume rm -f $ids >/dev/null
}

logs() {
  for name in $(podman ps -a --filter "label=com.docker.compose.project=$project" --format '{{.Names}}'); do
    echo "--- $name"; podman logs --tail 40 "$name" 2>&1
  done
}

case "${1:-}" in
  build) build ;;
  up) up ;;
  down) down ;;
  logs) logs ;;
  *) echo "usage: $0 build|up|down|logs" >&2; exit 2 ;;
esac
