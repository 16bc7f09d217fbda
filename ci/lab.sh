#!/usr/bin/env bash
# JupyterLab for `make lab`: token authentication on, no browser, the repository as root folder.
#   LAB_IP    the address to bind (default 127.0.0.1; the Docker images set 0.0.0.0)
#   LAB_PORT  the port (default 8888; Jupyter tries the next ones when it is taken)
#   LAB_DIR   the lab's own folder, inside the checkout (default build/lab, git-ignored)
# The lab never changes a tracked file. notebooks/*.ipynb are the lesson sources (committed
# without outputs); the lab works on copies of them in $LAB_DIR/notebooks, made or brought up to
# date at each start by ci/lab_notebooks.py: a learner runs and saves there and finds the outputs
# and edits again next time; when a lesson changed (git pull), its copy is replaced and a copy the
# learner had saved is kept in $LAB_DIR/kept/. The file browser opens on the working copies
# (01 first). ci/jupyter_server_config.py refuses any save into notebooks/ with a message naming
# the working copies. The executed notebooks of `make run` (build/notebooks, outputs and figures
# included) are the ones to open and read; their kernels' logs are in build/logs/notebooks.
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
LAB_DIR=${LAB_DIR:-build/lab}
LAB_DIR=${LAB_DIR%/}
# Inside the checkout: the preferred folder is a path under Jupyter's root folder, and notebooks
# find the checkout's data folder (data/cache) by walking up from their own folder.
case "$LAB_DIR" in
  ""|/*|..|../*|*/..|*/../*|notebooks|notebooks/*|*[[:space:]]*)
    echo "make lab: LAB_DIR='$LAB_DIR' must be a folder inside the checkout, outside notebooks/ (for example build/lab)" >&2
    exit 2 ;;
esac
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

echo "make lab: the lesson notebooks are copied to $LAB_DIR/notebooks, where you run and save them;"
echo "   notebooks/ (tracked by git) is never changed. The executed notebooks of \`make run\` are in build/notebooks."
"$PY" ci/lab_notebooks.py --dest "$LAB_DIR"
export EMBEDLAB_LAB_NOTEBOOKS="$LAB_DIR/notebooks"  # named by the save guard's message
args=(--ip="$LAB_IP" --port="$LAB_PORT" --no-browser --ServerApp.root_dir="$PWD"
      --config="$PWD/ci/jupyter_server_config.py" --ContentsManager.preferred_dir="$LAB_DIR/notebooks")
if [ "$(id -u)" = 0 ]; then
  echo "make lab: running as root, so Jupyter gets --allow-root (token authentication stays on)"
  args+=(--allow-root)
fi
echo "make lab: JupyterLab on $LAB_IP:$LAB_PORT; open the URL with ?token= printed below"
exec "$PY" -m jupyter lab "${args[@]}" "$@"
