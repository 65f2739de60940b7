#!/usr/bin/env bash
# The whole suite N times in a row (default 3) under a CPU hog per core: no test may depend on the load.
#
#   eval "$(bash tools/pg_test_server.sh start)"; eval "$(bash tools/opencode_setup.sh)"
#   bash tools/stress_suite.sh [RUNS] [HOGS]        # HOGS: busy processes (default: one per core)
#
# Needs `stress` (apt install stress). Each run's output goes to stress-run-K.log in the current directory and
# one summary line per run (exit code, seconds, load average) to stdout; the exit code is the first failing run's.
set -u
runs=${1:-3}
hogs=${2:-$(nproc)}
command -v stress >/dev/null || { echo "stress_suite: needs stress (apt install stress)" >&2; exit 2; }
stress --cpu "$hogs" >/dev/null 2>&1 &
hog=$!
trap 'kill "$hog" 2>/dev/null; pkill -P "$hog" 2>/dev/null' EXIT
status=0
for k in $(seq 1 "$runs"); do
  start=$(date +%s)
  CI=true python3 -m pytest -q -p no:randomly -rfE >"stress-run-$k.log" 2>&1
  rc=$?
  echo "run $k: rc=$rc, $(( $(date +%s) - start )) s, load average $(cut -d' ' -f1-3 /proc/loadavg), under $hogs CPU hogs"
  [ "$status" -eq 0 ] && status=$rc
done
exit "$status"
