#!/usr/bin/env bash
# JupyterLab for `make lab`: token authentication on, no browser, the repository as root folder.
# Jupyter refuses to run as root without --allow-root; containers and many lab machines run as
# root, so the flag is added exactly then. Extra arguments go to jupyter (e.g. --ip, --port).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
args=(--ip=127.0.0.1 --no-browser --ServerApp.root_dir="$PWD")
if [ "$(id -u)" = 0 ]; then
  echo "make lab: running as root, so Jupyter gets --allow-root (token authentication stays on)"
  args+=(--allow-root)
fi
exec "$PY" -m jupyter lab "${args[@]}" "$@"
