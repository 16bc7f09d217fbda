#!/usr/bin/env bash
# `make lab-test`: the lab as a learner starts and uses it.
# Starts `make lab` for real (the README's command) on a free port with EMBEDLAB_SCALE=ci, waits
# for it to serve, reads the token from what it printed, and runs ci/lab_browser_test.py (headless
# Chromium: login refused without the token, a first view that lists the working copies of the
# notebooks, a save into notebooks/ refused, a notebook opened and closed without being marked
# modified, notebook 01 run through the UI and saved, a screenshot under build/lab/).
# The lab's working copies go to a folder of this test (LAB_DIR=build/lab-test.XXXXXX, removed at
# the end), so that a learner's own copies in build/lab are never touched. Everything it started is
# stopped on every exit path: the `make lab` process group, then any kernel still running (kernels
# run in sessions of their own), by PID. It fails when the lab changed a notebook in notebooks/ or
# left files git would see: in a clean checkout (CI) `git status --porcelain` must stay empty.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
SCREENSHOT=build/lab/lab_test.png
[ -x "$PY" ] || { echo "lab_test: $PY not found: run make setup first"; exit 1; }

# Notebook 01 runs at ci scale in the lab's kernel: the kernel inherits the server's environment.
export EMBEDLAB_SCALE=ci
# The token the lab generates and prints, as for a user who sets none.
unset JUPYTER_TOKEN JUPYTER_TOKEN_FILE
work=$(mktemp -d /tmp/embedlab-lab-test.XXXXXX)
# The lab's runtime files, settings and workspaces in this test's folder: nothing of this lab's
# session stays in the user's own ~/.jupyter and ~/.local/share/jupyter.
export JUPYTER_RUNTIME_DIR="$work/runtime" JUPYTERLAB_SETTINGS_DIR="$work/settings" \
       JUPYTERLAB_WORKSPACES_DIR="$work/workspaces"
LOG="$work/make-lab.log"
mkdir -p build
lab_dir=$(mktemp -d build/lab-test.XXXXXX)
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
checkpoints_existed=0
[ -e notebooks/.ipynb_checkpoints ] && checkpoints_existed=1
# What the lab could change: the lesson sources, new files where Jupyter writes them (notebooks/,
# the root folder), and, in a clean checkout (CI), anything git sees.
lab_state() { sha256sum notebooks/*.ipynb; git ls-files --others --exclude-standard -- notebooks ':(glob)*'; }
before=$(lab_state)
was_clean=0
[ -z "$(git status --porcelain --untracked-files=all)" ] && was_clean=1

lab_pid="" browser_pid=""
descendants() {  # every process below $1, deepest last
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$child"; descendants "$child"; done
}
cleanup() {
  local rc=$? pids=() p left=()
  # Everything below the browser test (chromedriver, Chromium) and below make lab (Jupyter, its
  # kernels, which run in sessions of their own), listed before anything is stopped.
  for p in $browser_pid $lab_pid; do mapfile -t -O "${#pids[@]}" pids < <(descendants "$p"); done
  if [ -n "$browser_pid" ]; then
    kill -TERM "$browser_pid" 2>/dev/null || true  # it closes Chromium on TERM
    wait "$browser_pid" 2>/dev/null || true
  fi
  if [ -n "$lab_pid" ]; then
    if kill -0 "$lab_pid" 2>/dev/null; then
      # SIGTERM: Jupyter shuts its kernels down and exits.
      kill -TERM -- "-$lab_pid" 2>/dev/null || true
      for _ in $(seq 60); do kill -0 "$lab_pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$lab_pid" 2>/dev/null || true
    fi
    wait "$lab_pid" 2>/dev/null || true
  fi
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left+=("$p"); done
  if [ ${#left[@]} -gt 0 ]; then
    echo "lab_test: stopping processes left running: ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null || true
  fi
  # Jupyter makes notebooks/.ipynb_checkpoints (git-ignored) when a notebook is opened.
  if [ "$checkpoints_existed" = 0 ] && [ -d notebooks/.ipynb_checkpoints ]; then rm -rf notebooks/.ipynb_checkpoints; fi
  if [ "$rc" != 0 ] && [ -f "$LOG" ]; then echo "== the last lines of make lab's output"; tail -n 40 "$LOG"; fi
  rm -rf "$work" "$lab_dir"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "lab_test: interrupted"; exit 130' INT TERM

echo "== make lab LAB_PORT=$port LAB_DIR=$lab_dir (EMBEDLAB_SCALE=ci), as $(id -un)"
# A process group of its own (job control on for this one start), so that the whole of it
# (make, Jupyter) is stopped as one group.
set -m
make lab LAB_PORT="$port" LAB_DIR="$lab_dir" > "$LOG" 2>&1 < /dev/null &
lab_pid=$!
set +m

url="" t0=$(date +%s)
while :; do
  if ! kill -0 "$lab_pid" 2>/dev/null; then
    wait "$lab_pid" && status=0 || status=$?
    echo "lab_test: make lab exited (status $status) before serving"; exit 1
  fi
  url=$(grep -oE "http://127\.0\.0\.1:[0-9]+/lab\?token=[0-9a-f]+" "$LOG" | head -n 1 || true)
  if [ -n "$url" ] && "$PY" - "$port" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api", timeout=5)
except Exception:
    sys.exit(1)
EOF
  then break; fi
  if [ $(( $(date +%s) - t0 )) -gt 300 ]; then echo "lab_test: make lab did not serve within 300 s"; exit 1; fi
  sleep 1
done
token=${url##*token=}
served_port=$(echo "$url" | sed -E 's|http://127\.0\.0\.1:([0-9]+)/.*|\1|')
if [ "$served_port" != "$port" ]; then echo "lab_test: make lab LAB_PORT=$port served on port $served_port"; exit 1; fi
echo "   serving on http://127.0.0.1:$port/ after $(( $(date +%s) - t0 )) s (token from its output)"

echo "== headless Chromium against the lab"
t1=$(date +%s)
# In the background and waited for, so that a TERM or INT to this script stops it at once (its
# own handler closes Chromium).
"$PY" ci/lab_browser_test.py --url "http://127.0.0.1:$port/" --token "$token" --screenshot "$SCREENSHOT" &
browser_pid=$!
wait "$browser_pid" && status=0 || status=$?
browser_pid=""
[ "$status" = 0 ] || exit "$status"
echo "   browser test: $(( $(date +%s) - t1 )) s"

after=$(lab_state)
if [ "$before" != "$after" ]; then
  echo "lab_test: the lab changed a notebook in notebooks/ or left new files:"
  diff <(echo "$before") <(echo "$after") || true
  exit 1
fi
if [ "$was_clean" = 1 ] && [ -n "$(git status --porcelain --untracked-files=all)" ]; then
  echo "lab_test: git status was clean before the test and is not after it:"
  git status --porcelain --untracked-files=all
  exit 1
fi
echo "notebooks/ unchanged, no new files$([ "$was_clean" = 1 ] && echo ', git status --porcelain empty')"
echo "screenshot of the lab with notebook 01 executed: $SCREENSHOT"
