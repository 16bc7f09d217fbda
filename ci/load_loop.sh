#!/usr/bin/env bash
# Runs a command again and again under artificial CPU load and reports how every run ended.
#
#   ci/load_loop.sh [-n RUNS] [-d SECONDS] [-b BUSY] [-t TIMEOUT] [-o LOGDIR] -- COMMAND [ARGS...]
#
#   -n RUNS     runs at most (default 10)
#   -d SECONDS  starts no new run after this many seconds (default: no limit)
#   -b BUSY     busy processes ("while :; do :; done") kept running meanwhile (default: 2 per core)
#   -t TIMEOUT  a run still going after TIMEOUT seconds is killed and counts as a failure (exit 124;
#               default 600)
#   -o LOGDIR   keeps each failed run's output there as run_<i>.log (default: a new temporary folder)
#
# Each run gets PYTHONFAULTHANDLER=1, so a Python process killed by a fatal signal (SIGABRT,
# SIGSEGV) prints every thread's stack into the kept log. One line per run: its number, exit
# status, seconds and the 1-minute load average when it ended; then a summary line
#   load_loop: RUNS runs, FAILED failed (exit statuses: ...), load average min/mean/max A/B/C, BUSY busy
# The exit status is 0 when every run exited 0, else 1. The busy processes are started here and
# killed here (by PID) when the loop ends, however it ends.
set -u

runs=10 duration=0 busy=$((2 * $(nproc))) timeout_s=600 logdir=""
while getopts "n:d:b:t:o:h" opt; do
  case $opt in
    n) runs=$OPTARG ;; d) duration=$OPTARG ;; b) busy=$OPTARG ;; t) timeout_s=$OPTARG ;; o) logdir=$OPTARG ;;
    h) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "load_loop: see ci/load_loop.sh -h" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
if [ $# -eq 0 ]; then echo "load_loop: no command given (ci/load_loop.sh [options] -- COMMAND...)" >&2; exit 2; fi
for v in "$runs" "$busy" "$timeout_s" "$duration"; do
  case $v in ''|*[!0-9]*) echo "load_loop: -n, -b, -t and -d take whole numbers, got '$v'" >&2; exit 2 ;; esac
done
[ -n "$logdir" ] || logdir=$(mktemp -d /tmp/load_loop.XXXXXX)
mkdir -p "$logdir"

busy_pids=()
cleanup() {
  for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${busy_pids[@]}"; do wait "$p" 2>/dev/null; done
  busy_pids=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for _ in $(seq 1 "$busy"); do
  bash -c 'while :; do :; done' &
  busy_pids+=($!)
done

start=$SECONDS failed=0 done_runs=0 codes="" loads=()
for i in $(seq 1 "$runs"); do
  if [ "$duration" -gt 0 ] && [ $((SECONDS - start)) -ge "$duration" ]; then break; fi
  t0=$SECONDS
  PYTHONFAULTHANDLER=1 timeout -k 10 "$timeout_s" "$@" >"$logdir/current.log" 2>&1
  rc=$?
  load=$(cut -d' ' -f1 /proc/loadavg)
  loads+=("$load")
  done_runs=$i
  if [ $rc -ne 0 ]; then
    failed=$((failed + 1))
    codes="$codes $rc"
    mv "$logdir/current.log" "$logdir/run_$i.log"
    echo "run $i: exit $rc after $((SECONDS - t0)) s, load $load (output: $logdir/run_$i.log)"
  else
    echo "run $i: exit 0 after $((SECONDS - t0)) s, load $load"
  fi
done
rm -f "$logdir/current.log"
cleanup
stats=$(printf '%s\n' "${loads[@]:-0}" | awk '{s+=$1; if(NR==1||$1<mn)mn=$1; if($1>mx)mx=$1} END{printf "%.1f/%.1f/%.1f", mn, s/NR, mx}')
echo "load_loop: $done_runs runs, $failed failed (exit statuses:${codes:- none}), load average min/mean/max $stats, $busy busy processes, command: $*"
[ "$failed" -eq 0 ]
