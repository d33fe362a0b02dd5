#!/usr/bin/env bash
# Run one tinyvllm server on this machine: the frontend, the scheduler and its workers (one, or one per device with
# --tensor-parallel-size/--pipeline-parallel-size; none with --external-workers: see deploy/workers.sh, docs/DEPLOY.md).
# Environment: DEV (tinygrad backend: CPU, CUDA, NV, AMD, METAL; default: tinygrad's choice),
# HOST (default 127.0.0.1), PORT (default 8000), MODEL (default: SmolLM2-135M-Instruct), and any
# further `tinyvllm serve` options as arguments, e.g. deploy/serve.sh --max-num-seqs 64 --kv-cache-memory 8G
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/tinyvllm ] || make install
args=(--host "${HOST:-127.0.0.1}" --port "${PORT:-8000}")
[ -n "${MODEL:-}" ] && args+=(--model "$MODEL")
exec .venv/bin/tinyvllm serve "${args[@]}" "$@"
