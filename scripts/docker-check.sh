#!/usr/bin/env bash
# On demand, never part of scripts/test.sh: build the image from docker/Dockerfile and run the demo in
# it (scripts/demo.sh: a job preempted three times on the container's local cluster ends with the
# result of an uninterrupted run). Exits non-zero when the build or the demo fails. Needs an engine.
#
# When the engine has no debian:12-slim and cannot pull one (no registry), makes it (as root): a
# minbase bookworm from debootstrap, imported with `docker import`. The host's own extra CAs
# (/usr/local/share/ca-certificates/*.crt, e.g. a TLS-intercepting proxy's) go into it, so the build's
# apt and pip trust what the host trusts.
#
# The build uses the host's network (an engine without a bridge, or without NAT, has no other); the demo
# runs on the engine's default network and needs no internet. DOCKER_CHECK_NETWORK=host runs it on the
# host's network (an engine started with --bridge=none), DEMO_PORT then keeps its ports off others'.
# Environment: DOCKER_CHECK_IMAGE (slurm-preempt:check), DOCKER_CHECK_NETWORK (the engine's default),
# DEMO_PORT (17200), DEBIAN_MIRROR (http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/.."
image=${DOCKER_CHECK_IMAGE:-slurm-preempt:check}
network=${DOCKER_CHECK_NETWORK:-}
base=debian:12-slim
fail() { echo "docker-check: $*" >&2; exit 1; }

command -v docker >/dev/null || fail "no docker command: install Docker (or Debian's docker.io)"
docker info >/dev/null 2>&1 || fail "no engine answers (docker info): start dockerd, or set DOCKER_HOST"

make_base() {
  [ "$(id -u)" -eq 0 ] || fail "need root to make $base with debootstrap"
  command -v debootstrap >/dev/null || fail "no debootstrap to make $base: apt-get install debootstrap"
  local root
  root=$(mktemp -d /tmp/docker-check-root.XXXXXX)
  chmod 755 "$root"  # it becomes the image's /: mktemp's 0700 locks out _apt, munge, mysql
  echo "docker-check: making $base with debootstrap (minbase bookworm) in $root"
  debootstrap --variant=minbase bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
    >"$root.log" 2>&1 || { tail -5 "$root.log" >&2; fail "debootstrap failed (log: $root.log)"; }
  rm -f "$root.log"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  # Picked up by update-ca-certificates when the Dockerfile installs ca-certificates.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  tar -C "$root" -c . | docker import -c 'CMD ["bash"]' - "$base" >/dev/null
  rm -rf "$root"
}

if ! docker image inspect "$base" >/dev/null 2>&1; then
  if ! docker pull -q "$base" >/dev/null 2>&1; then
    echo "docker-check: cannot pull $base"
    SECONDS=0
    make_base
    echo "docker-check: $base made in ${SECONDS} s"
  fi
fi

SECONDS=0
docker build --network host -f docker/Dockerfile -t "$image" . || fail "the image did not build"
echo "docker-check: image $image built in ${SECONDS} s"

SECONDS=0
run_options=(--rm --init -e "DEMO_PORT=${DEMO_PORT:-17200}")
[ -n "$network" ] && run_options+=(--network "$network")
docker run "${run_options[@]}" "$image" bash scripts/demo.sh || fail "the demo failed"
echo "docker-check: demo passed in ${SECONDS} s (image $image, network ${network:-default})"
