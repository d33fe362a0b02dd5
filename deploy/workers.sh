#!/usr/bin/env bash
# Start this machine's workers for a `tinyvllm serve --external-workers` (docs/DEPLOY.md): one `tinyvllm worker`
# per device, ranks FIRST_RANK, FIRST_RANK + 1, ...; each on its own GPU (DEV=CUDA:i), or, without GPUs, each on
# its share of the CPU cores.
#   deploy/workers.sh [--first-rank R] [--count N] [--only-rank R] [tinyvllm worker options...]
# --first-rank  the rank of this machine's first worker (default $FIRST_RANK, else 0): on the second machine of
#               an engine with 2 devices per machine, 2
# --count       how many workers (default: the GPUs `nvidia-smi -L` lists, else 1)
# --only-rank   start only this rank's worker, in the foreground (what deploy/tinyvllm-worker@.service runs)
# Environment: TINYVLLM_SCHEDULER (the server's --worker-address as this machine reaches it, e.g.
# tcp://10.0.0.1:7000; or pass --connect), TINYVLLM_WORKER_SECRET (the server's secret), MODEL (or pass --model),
# DEV (tinygrad backend; default CUDA when there are GPUs, else CPU). Every other option goes to every worker, e.g.
#   TINYVLLM_SCHEDULER=tcp://10.0.0.1:7000 deploy/workers.sh --first-rank 2 -tp 2 -pp 2 --model /models/m.gguf
# Exits when a worker does, with its exit code (3: refused by the scheduler), after stopping the others.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/tinyvllm ] || make install

first_rank=${FIRST_RANK:-0} count="" only_rank="" options=()
while [ $# -gt 0 ]; do
  case "$1" in
    --first-rank) first_rank=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    --only-rank) only_rank=$2; shift 2 ;;
    *) options+=("$1"); shift ;;
  esac
done
[ -n "${TINYVLLM_SCHEDULER:-}" ] && options=(--connect "$TINYVLLM_SCHEDULER" "${options[@]}")
[ -n "${MODEL:-}" ] && options+=(--model "$MODEL")

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
backend=${DEV:-$([ "${gpus:-0}" -gt 0 ] && echo CUDA || echo CPU)}
backend=${backend%%:*}
count=${count:-$([ "${gpus:-0}" -gt 0 ] && echo "$gpus" || echo 1)}

if [ -n "$only_rank" ]; then
  device=$(( only_rank - first_rank ))
  [ "$device" -ge 0 ] && [ "$device" -lt "$count" ] || { echo "rank $only_rank is not one of this machine's $count workers from rank $first_rank" >&2; exit 2; }
  # the worker takes device $device (or its share of the cores) itself, as the launcher places its own workers
  DEV=$backend exec .venv/bin/tinyvllm worker --rank "$only_rank" --local-index "$device" --local-count "$count" \
    "${options[@]}"
fi

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM
for (( device = 0; device < count; device++ )); do
  DEV=$backend .venv/bin/tinyvllm worker --rank $(( first_rank + device )) --local-index "$device" \
    --local-count "$count" "${options[@]}" &
  pids+=($!)
done
status=0
wait -n || status=$?
kill "${pids[@]}" 2>/dev/null || true
wait || true
exit "$status"
