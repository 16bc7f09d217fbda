#!/usr/bin/env bash
# System packages that pip cannot provide. Idempotent; needs root (CI and containers are root).
#   ci/install_system.sh        what `make setup` needs: a compiler, make, venv, redis-server
#   ci/install_system.sh --ci   also what CI's front-door tests need: Chromium and its driver (the
#                               browser test of the lab), a Docker engine and docker-compose
#                               (make docker-test), debootstrap (a local base image when no image
#                               registry is reachable)
# The package lists are removed in the same step, so an image layer that runs this keeps none.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have g++ || need+=(g++)
have make || need+=(make)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
# redis-server (Debian's package also provides redis-cli and redis-benchmark): the HPS's Redis tier.
{ have redis-server && have redis-cli; } || need+=(redis-server)
if [ "${1:-}" = "--ci" ]; then
  have chromium || need+=(chromium)
  have chromedriver || need+=(chromium-driver)
  have dockerd || need+=(docker.io)
  have docker-compose || need+=(docker-compose)
  have debootstrap || need+=(debootstrap)
  have curl || need+=(curl)
elif [ -n "${1:-}" ]; then
  echo "ci/install_system.sh: unknown option '$1' (the only option is --ci)"; exit 2
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "missing system packages: ${need[*]} (run as root or install them)"; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  echo "== apt-get install ${need[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  apt-get clean
  rm -rf /var/lib/apt/lists/*
fi
