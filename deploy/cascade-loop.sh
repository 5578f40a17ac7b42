#!/bin/sh
# cascade-loop POLL_S BACKOFF_S STEP...: the long-running workers' loop (the retrain worker,
# the rollout controller; in the jobs image as /usr/local/bin/cascade-loop). Each round runs
# the STEPs in order, each only if the one before exited 0 (a STEP is a command line, split
# on blanks, no quoting), then pauses POLL_S seconds, or BACKOFF_S after a failed step.
# Each step runs as a child of this shell, which is PID 1 in a container: SIGTERM (or SIGINT)
# is passed to the running step, whose exit is awaited, then the loop exits 143. Each round
# touches the heartbeat file (CASCADE_LOOP_HEARTBEAT, default /tmp/heartbeat) that the
# liveness probe checks. CASCADE_LOOP_ROUNDS=N stops after N rounds (default 0: never).
set -uf

usage() {
  echo "usage: cascade-loop POLL_S BACKOFF_S STEP... (seconds as whole numbers)" >&2
  exit 2
}
[ "$#" -ge 3 ] || usage
case "$1$2" in *[!0-9]*) usage ;; esac
poll=$1
backoff=$2
shift 2
heartbeat=${CASCADE_LOOP_HEARTBEAT:-/tmp/heartbeat}
rounds=${CASCADE_LOOP_ROUNDS:-0}
case "$rounds" in '' | *[!0-9]*) echo "cascade-loop: CASCADE_LOOP_ROUNDS must be a whole number" >&2; exit 2 ;; esac

child=""
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 143' TERM INT
run() {
  "$@" &
  child=$!
  wait "$child"
}

round=0
while :; do
  touch "$heartbeat"
  status=0
  for step in "$@"; do
    # shellcheck disable=SC2086  # a step is a command line: split it into words
    run $step || { status=$?; echo "cascade-loop: '$step' exited $status" >&2; break; }
  done
  round=$((round + 1))
  if [ "$rounds" -gt 0 ] && [ "$round" -ge "$rounds" ]; then
    exit "$status"
  fi
  if [ "$status" -eq 0 ]; then pause=$poll; else pause=$backoff; fi
  sleep "$pause" &
  child=$!
  wait "$child"
done
