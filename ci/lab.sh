#!/usr/bin/env bash
# JupyterLab for `make lab`: token authentication on, no browser, the repository as root folder.
#   LAB_IP    the address to bind (default 127.0.0.1; the Docker images set 0.0.0.0)
#   LAB_PORT  the port (default 8888; Jupyter tries the next ones when it is taken)
# Jupyter is given exactly one --ip and one --port: it stops with "ip only accepts one value" on
# two, so an address or port among the extra arguments is refused with the variable to set
# instead. Other extra arguments go to `jupyter lab` unchanged.
# Jupyter refuses to run as root without --allow-root; containers and many lab machines run as
# root, so the flag is added exactly then.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LAB_IP=${LAB_IP:-127.0.0.1}
LAB_PORT=${LAB_PORT:-8888}

if [ -z "$LAB_IP" ] || [[ "$LAB_IP" == *[[:space:]]* ]]; then
  echo "make lab: LAB_IP='$LAB_IP' is not an address (for example LAB_IP=127.0.0.1 or LAB_IP=0.0.0.0)" >&2
  exit 2
fi
if ! [[ "$LAB_PORT" =~ ^[0-9]+$ ]] || [ "$LAB_PORT" -lt 1 ] || [ "$LAB_PORT" -gt 65535 ]; then
  echo "make lab: LAB_PORT='$LAB_PORT' is not a port number (1-65535)" >&2
  exit 2
fi
for arg in "$@"; do
  case "$arg" in
    --ip|--ip=*|--ServerApp.ip|--ServerApp.ip=*)
      echo "make lab: give the address as LAB_IP (make lab LAB_IP=0.0.0.0), not as '$arg': Jupyter takes one --ip" >&2
      exit 2 ;;
    --port|--port=*|--ServerApp.port|--ServerApp.port=*)
      echo "make lab: give the port as LAB_PORT (make lab LAB_PORT=8890), not as '$arg': Jupyter takes one --port" >&2
      exit 2 ;;
  esac
done

args=(--ip="$LAB_IP" --port="$LAB_PORT" --no-browser --ServerApp.root_dir="$PWD")
if [ "$(id -u)" = 0 ]; then
  echo "make lab: running as root, so Jupyter gets --allow-root (token authentication stays on)"
  args+=(--allow-root)
fi
echo "make lab: JupyterLab on $LAB_IP:$LAB_PORT; open the URL with ?token= printed below"
exec "$PY" -m jupyter lab "${args[@]}" "$@"
