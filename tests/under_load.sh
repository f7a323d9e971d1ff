#!/usr/bin/env bash
# Run a command while busy loops compete for the CPU (a reader's busy laptop), then stop them.
#   tests/under_load.sh [-n LOOPS] COMMAND [ARGS...]     (default: one loop, burning one core)
# Exits with COMMAND's status; each loop also ends by itself after an hour. `make robust` uses it.
set -u
loops=1
if [ "${1:-}" = "-n" ]; then loops=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: tests/under_load.sh [-n LOOPS] COMMAND [ARGS...]" >&2; exit 2; }
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done; }
trap cleanup EXIT INT TERM
for _ in $(seq "$loops"); do
  timeout 3600 sh -c 'while :; do :; done' &
  pids+=($!)
done
echo "under_load: $loops busy loop(s) beside: $*" >&2
"$@"
status=$?
cleanup
exit $status
