#!/usr/bin/env bash
# System packages the tests need that pip cannot provide. Idempotent; needs root (CI is root).
set -euo pipefail
need=()
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
# redis-server (Debian's package also provides redis-cli and redis-benchmark): the HPS's Redis tier.
{ command -v redis-server && command -v redis-cli; } >/dev/null 2>&1 || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "missing system packages: ${need[*]} (run as root or install them)"; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
