#!/usr/bin/env bash
# The image's entrypoint (Containerfile): `serve`, `worker` or `router`, then that command's `tinyvllm` flags.
#   serve  [flags]  tinyvllm serve  --host ${HOST:-0.0.0.0} --port ${PORT:-8000} [--model $MODEL] [flags]
#   worker [flags]  tinyvllm worker [--connect $TINYVLLM_SCHEDULER] [--rank R] [--model $MODEL] [flags]
#   router [flags]  tinyvllm router --host ${HOST:-0.0.0.0} --port ${PORT:-8080} [flags]
#   -flags          serve -flags
#   anything else   run as given (e.g. `bash`, or `tinyvllm bench serve ...`)
# The environment gives defaults and the flags after the mode override them (the last of a repeated flag wins).
# TENSOR_PARALLEL_SIZE and PIPELINE_PARALLEL_SIZE become -tp/-pp of serve and worker. A worker's rank is WORKER_RANK,
# or, in a LeaderWorkerSet, LWS_WORKER_INDEX x TENSOR_PARALLEL_SIZE + TP_RANK: pod i of the group is pipeline stage
# i, its containers the tensor-parallel ranks TP_RANK 0..T-1 (deploy/kubernetes/leaderworkerset/). A worker whose
# TINYVLLM_SCHEDULER names a host waits up to WAIT_FOR_SCHEDULER_S (300) seconds for the name to resolve: in a
# LeaderWorkerSet the leader's DNS record may come after its workers start.
# DEV (tinygrad's backend), TINYVLLM_API_KEY and the TINYVLLM_WORKER_, _ROUTER_ and _KV_SECRET stay in the
# environment, where tinyvllm reads them: secrets never go on the command line, which `ps` shows to everyone.
# It execs tinyvllm, so the SIGTERM of a pod's termination reaches tinyvllm itself, which drains
# (--shutdown-timeout, 30 s; keep terminationGracePeriodSeconds above it).
set -euo pipefail

die() { echo "container-entrypoint: $*" >&2; exit 2; }
integer() { [[ "$2" =~ ^[0-9]+$ ]] || die "$1 must be a whole number, not '$2'"; }

parallel_flags() {
  if [ -n "${TENSOR_PARALLEL_SIZE:-}" ]; then integer TENSOR_PARALLEL_SIZE "$TENSOR_PARALLEL_SIZE"; args+=(-tp "$TENSOR_PARALLEL_SIZE"); fi
  if [ -n "${PIPELINE_PARALLEL_SIZE:-}" ]; then integer PIPELINE_PARALLEL_SIZE "$PIPELINE_PARALLEL_SIZE"; args+=(-pp "$PIPELINE_PARALLEL_SIZE"); fi
  return 0
}

wait_for_scheduler() {  # $1: tcp://HOST:PORT
  local host=${1#tcp://} waited=0 limit=${WAIT_FOR_SCHEDULER_S:-300}
  host=${host%:*}
  integer WAIT_FOR_SCHEDULER_S "$limit"
  [[ "$1" == tcp://* && "$host" =~ [a-zA-Z] && "$host" != \[* ]] || return 0  # a name, not an address
  until getent hosts "$host" >/dev/null; do
    [ "$waited" -lt "$limit" ] || { echo "container-entrypoint: $host did not resolve within $limit s" >&2; exit 1; }
    [ "$waited" -gt 0 ] || echo "container-entrypoint: waiting for $host to resolve" >&2
    sleep 1; waited=$((waited + 1))
  done
}

mode=${1:-serve}
[ $# -gt 0 ] && shift
if [[ "$mode" == -* ]]; then set -- "$mode" "$@"; mode=serve; fi  # flags alone: serve's
case "$mode" in
  serve)
    args=(serve --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}")
    [ -z "${MODEL:-}" ] || args+=(--model "$MODEL")
    parallel_flags ;;
  worker)
    args=(worker)
    if [ -n "${TINYVLLM_SCHEDULER:-}" ]; then wait_for_scheduler "$TINYVLLM_SCHEDULER"; args+=(--connect "$TINYVLLM_SCHEDULER"); fi
    if [ -n "${WORKER_RANK:-}" ]; then
      integer WORKER_RANK "$WORKER_RANK"; args+=(--rank "$WORKER_RANK")
    elif [ -n "${LWS_WORKER_INDEX:-}" ]; then
      integer LWS_WORKER_INDEX "$LWS_WORKER_INDEX"; integer TENSOR_PARALLEL_SIZE "${TENSOR_PARALLEL_SIZE:-1}"
      integer TP_RANK "${TP_RANK:-0}"
      [ "${TP_RANK:-0}" -lt "${TENSOR_PARALLEL_SIZE:-1}" ] || die "TP_RANK $TP_RANK is not below TENSOR_PARALLEL_SIZE ${TENSOR_PARALLEL_SIZE:-1}"
      args+=(--rank "$((LWS_WORKER_INDEX * ${TENSOR_PARALLEL_SIZE:-1} + ${TP_RANK:-0}))")
    fi
    [ -z "${MODEL:-}" ] || args+=(--model "$MODEL")
    parallel_flags ;;
  router)
    args=(router --host "${HOST:-0.0.0.0}" --port "${PORT:-8080}") ;;
  *)
    exec "$mode" "$@" ;;
esac
exec tinyvllm "${args[@]}" "$@"
