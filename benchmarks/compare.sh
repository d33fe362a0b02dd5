#!/usr/bin/env bash
# Compare tinyvllm with vLLM (CPU) and llama.cpp's llama-server on the default model (SmolLM2-135M-Instruct):
# each server in turn is started alone on a free 127.0.0.1 port, loaded by `tinyvllm bench serve` with the same
# random prompts (same tokenizer, same seed), and stopped; then one markdown table is printed.
#
#   benchmarks/compare.sh                         # all three servers, concurrency 1 4 16 64
#   benchmarks/compare.sh --servers llama-server --concurrency 1 --num-prompts 2 --output-len 8   # a quick check
#
# Options (each also as an environment variable, in capitals: SERVERS, INPUT_LEN, ...):
#   --servers "tinyvllm vllm llama-server"   which to run; the others' JSON from an earlier run in --out is reused
#   --model FILE.gguf                        another GGUF than the default model, served by tinyvllm and llama-server
#                                            from the same file (its own tokenizer makes the prompts; not vLLM)
#   --input-len 256 --output-len 128         prompt tokens and generated tokens per request (ignore_eos is on)
#   --concurrency "1 4 16 64"                levels, each run as its own `bench serve` call
#   --num-prompts N                          measured requests per level (default: max(4, concurrency): one full wave)
#   --warmup N                               unmeasured requests before each level (default: 1; tinyvllm captures its jitted steps at start-up)
#   --threads 2                              CPU threads for llama-server (-t) and vLLM (VLLM_CPU_OMP_THREADS_BIND)
#   (vLLM also gets VLLM_CPU_KVCACHE_SPACE=2 GiB and LD_PRELOAD of the venv's libiomp5.so and the system's tcmalloc,
#    as its CPU guide says; VLLM_LD_PRELOAD="" turns the preload off, DEV=... picks tinyvllm's backend)
#   --out DIR                                JSON and server logs (default benchmarks/results/compare), and each
#                                            server's memory after its last level (<name>-rss-mb.txt: the PSS of its
#                                            processes, so pages they share count once); one folder per --model
#   --tinyvllm-args "..."  --vllm-args "..."  --llama-args "..."   extra flags for each server
#   --vllm-bench                             also run `vllm bench serve` against tinyvllm (a protocol check)
#   READY_TIMEOUT=seconds                    how long a server may take to start (default 1800/1200/300)
# The peers must be set up first: benchmarks/peers/setup.sh (cached in $TINYVLLM_PEERS_DIR, built once).
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/peers/common.sh

SERVERS=${SERVERS:-tinyvllm vllm llama-server}
INPUT_LEN=${INPUT_LEN:-256}; OUTPUT_LEN=${OUTPUT_LEN:-128}; CONCURRENCY=${CONCURRENCY:-1 4 16 64}
NUM_PROMPTS=${NUM_PROMPTS:-}; WARMUP=${WARMUP:-}; THREADS=${THREADS:-2}
OUT=${OUT:-benchmarks/results/compare}; VLLM_BENCH=${VLLM_BENCH:-0}
TINYVLLM_ARGS=${TINYVLLM_ARGS:-}; VLLM_ARGS=${VLLM_ARGS:-}; LLAMA_ARGS=${LLAMA_ARGS:-}
MODEL_NAME=SmolLM2-135M-Instruct; GGUF=${MODEL:-}
while [ $# -gt 0 ]; do
  case $1 in
    --servers) SERVERS=$2; shift 2;;
    --model) GGUF=$2; shift 2;;
    --input-len) INPUT_LEN=$2; shift 2;;
    --output-len) OUTPUT_LEN=$2; shift 2;;
    --concurrency) CONCURRENCY=$2; shift 2;;
    --num-prompts) NUM_PROMPTS=$2; shift 2;;
    --warmup) WARMUP=$2; shift 2;;
    --threads) THREADS=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    --tinyvllm-args) TINYVLLM_ARGS=$2; shift 2;;
    --vllm-args) VLLM_ARGS=$2; shift 2;;
    --llama-args) LLAMA_ARGS=$2; shift 2;;
    --vllm-bench) VLLM_BENCH=1; shift;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
mkdir -p "$OUT"
if [ -n "$GGUF" ]; then
  [ -f "$GGUF" ] || { echo "compare.sh: --model $GGUF: no such file" >&2; exit 2; }
  GGUF=$(realpath "$GGUF"); MODEL_NAME=$(basename "$GGUF" .gguf)
  [[ " $SERVERS " == *" vllm "* ]] && { echo "compare.sh: --model is for tinyvllm and llama-server (vLLM serves the default model's HF folder)" >&2; exit 2; }
else
  GGUF=$(default_gguf)
fi
MAX_C=0; for c in $CONCURRENCY; do [ "$c" -gt "$MAX_C" ] && MAX_C=$c; done
MAX_LEN=$((INPUT_LEN + OUTPUT_LEN + 64))  # per sequence, with room for a BOS and tokenizer drift

free_port() { "$TINYVLLM_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

SERVER_PID=
resident_mb() {  # the server's processes' proportional set size together (shared pages counted once), MB
  local pid total=0
  for pid in $(pgrep -g "$SERVER_PID" || true); do
    total=$((total + $(awk '/^Pss:/{print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)))
  done
  echo $((total / 1024))
}
stop_server() {  # the whole process group (vLLM and tinyvllm start worker processes)
  [ -n "$SERVER_PID" ] || return 0
  gone() { ! kill -0 -- "-$SERVER_PID" 2>/dev/null; }
  local pids; pids=$(pgrep -g "$SERVER_PID" || true)
  # the leader first, so it can shut its workers down in order (and free their shared memory); then the group
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 60); do gone && break; sleep 0.5; done
  gone || kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 20); do gone && break; sleep 0.5; done
  gone || kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  # Intel OpenMP (preloaded into vLLM) leaves a /dev/shm file per process that is killed (vLLM kills its worker)
  for pid in $pids; do rm -f "/dev/shm/__KMP_REGISTERED_LIB_${pid}_"*; done
  SERVER_PID=
}
trap stop_server EXIT
trap 'exit 130' INT TERM

start_server() {  # start_server <name> <port>: in its own process group, log in $OUT/<name>.log; wait until ready
  local name=$1 port=$2 timeout path=/v1/models
  case $name in
    tinyvllm)
      timeout=${READY_TIMEOUT:-1800}  # it compiles its jitted steps (one per batch size and prompt chunk) first
      # the KV cache llama-server gets (-c below), unless the caller sizes it
      local kv="--num-kv-blocks $(( MAX_C * ((MAX_LEN + 15) / 16) ))"
      [[ "$TINYVLLM_ARGS" == *kv-cache-memory* || "$TINYVLLM_ARGS" == *num-kv-blocks* ]] && kv=
      # shellcheck disable=SC2086
      DEV=${DEV:-CPU} setsid "$TINYVLLM_BIN/tinyvllm" serve --model "$GGUF" --host 127.0.0.1 --port "$port" --served-model-name "$MODEL_NAME" \
        --max-num-seqs "$MAX_C" --max-model-len "$MAX_LEN" --warmup-before-serving $kv $TINYVLLM_ARGS > "$OUT/$name.log" 2>&1 &;;
    vllm)
      timeout=${READY_TIMEOUT:-1200}  # ~3 minutes on a 2-CPU machine (import, model load, torch.compile, warm-up)
      [ -x "$VLLM_PY" ] && [ -f "$HF_MODEL_DIR/config.json" ] || { echo "vLLM is not set up: run benchmarks/peers/setup.sh" >&2; return 1; }
      # vLLM's CPU guide preloads Intel OpenMP (shipped in the venv) and tcmalloc (if the system has it)
      local preload=${VLLM_LD_PRELOAD-$(ls "$VLLM_VENV"/lib/libiomp5.so 2>/dev/null; ldconfig -p | awk '/libtcmalloc_minimal\.so\.4 /{print $NF; exit}')}
      # shellcheck disable=SC2086
      LD_PRELOAD=$(echo $preload | tr ' ' ':') VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-$((THREADS - 1))} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} \
        setsid "$VLLM_PY" "$VLLM_MAIN" serve "$HF_MODEL_DIR" --host 127.0.0.1 --port "$port" --served-model-name "$MODEL_NAME" \
        --dtype float32 --max-model-len "$MAX_LEN" --max-num-seqs "$MAX_C" $VLLM_ARGS > "$OUT/$name.log" 2>&1 &;;
    llama-server)
      timeout=${READY_TIMEOUT:-300}; path=/health
      [ -x "$LLAMA_SERVER" ] || { echo "llama-server is not built: run benchmarks/peers/setup.sh" >&2; return 1; }
      # shellcheck disable=SC2086
      setsid "$LLAMA_SERVER" -m "$GGUF" --alias "$MODEL_NAME" --host 127.0.0.1 --port "$port" -t "$THREADS" \
        -np "$MAX_C" -c $((MAX_C * MAX_LEN)) $LLAMA_ARGS > "$OUT/$name.log" 2>&1 &;;
    *) echo "unknown server $name (tinyvllm, vllm, llama-server)" >&2; return 1;;
  esac
  SERVER_PID=$!
  local start=$SECONDS
  until curl -sf -o /dev/null "http://127.0.0.1:$port$path"; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "$name exited while starting; the end of $OUT/$name.log:" >&2; tail -n 30 "$OUT/$name.log" >&2; return 1; fi
    if [ $((SECONDS - start)) -gt "$timeout" ]; then echo "$name not ready after ${timeout}s; see $OUT/$name.log" >&2; return 1; fi
    sleep 2
  done
  echo "$name ready on port $port after $((SECONDS - start))s" >&2
}

bench() {  # bench <name> <port>: one `bench serve` call per concurrency level -> $OUT/<name>-c<level>.json
  local name=$1 port=$2 c n w
  for c in $CONCURRENCY; do
    n=${NUM_PROMPTS:-$(( c > 4 ? c : 4 ))}; w=${WARMUP:-1}
    echo "== $name, concurrency $c: $n requests ($w warm-up), $INPUT_LEN in / $OUTPUT_LEN out" >&2
    rm -f "$OUT/$name-c$c.json"
    "$TINYVLLM_BIN/tinyvllm" bench serve --base-url "http://127.0.0.1:$port" --model "$MODEL_NAME" --tokenizer "$GGUF" \
      --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" --ignore-eos --num-prompts "$n" \
      --warmup "$w" --max-concurrency "$c" --disable-tqdm --json "$OUT/$name-c$c.json" || echo "warning: $name at concurrency $c had failures" >&2
  done
}

vllm_bench_against_tinyvllm() {  # vLLM's own load generator against tinyvllm: do we speak its protocol?
  local port=$1
  [ -x "$VLLM_PY" ] || { echo "vLLM is not set up: run benchmarks/peers/setup.sh" >&2; return 1; }
  echo "== vllm bench serve against tinyvllm" >&2
  "$VLLM_PY" "$VLLM_MAIN" bench serve --backend openai --base-url "http://127.0.0.1:$port" --endpoint /v1/completions \
    --model "$MODEL_NAME" --tokenizer "$HF_MODEL_DIR" --dataset-name random --random-input-len "$INPUT_LEN" \
    --random-output-len "$OUTPUT_LEN" --ignore-eos --temperature 0 --num-prompts "${NUM_PROMPTS:-$(( MAX_C > 4 ? MAX_C : 4 ))}" \
    --max-concurrency "$MAX_C" --save-result --result-dir "$OUT" --result-filename vllm-bench-tinyvllm.json
}

for name in $SERVERS; do
  rm -f "$OUT/$name"-c*.json  # this run replaces them (a server that fails to start leaves none, not stale ones)
  port=$(free_port)
  if start_server "$name" "$port"; then
    bench "$name" "$port"
    resident_mb > "$OUT/$name-rss-mb.txt"
    [ "$name" = tinyvllm ] && [ "$VLLM_BENCH" = 1 ] && { vllm_bench_against_tinyvllm "$port" || echo "warning: vllm bench serve failed" >&2; }
  fi
  stop_server
done

specs=()
for name in tinyvllm vllm llama-server; do
  for c in $CONCURRENCY; do [ -f "$OUT/$name-c$c.json" ] && specs+=("$name=$OUT/$name-c$c.json"); done
done
echo
echo "$MODEL_NAME, $INPUT_LEN prompt tokens, $OUTPUT_LEN output tokens (ignore_eos), $(nproc) CPUs; ratios > 1 favour tinyvllm for tok/s, < 1 for TTFT"
[ ${#specs[@]} -gt 0 ] && "$TINYVLLM_PYTHON" benchmarks/compare_table.py --concurrency "$CONCURRENCY" "${specs[@]}"
for name in $SERVERS; do
  if [ -f "$OUT/$name-rss-mb.txt" ]; then echo "$name memory (PSS) after the run: $(cat "$OUT/$name-rss-mb.txt") MB"; fi
done
