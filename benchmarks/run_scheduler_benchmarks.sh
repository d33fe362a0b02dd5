#!/usr/bin/env bash
# Runs both scheduler benchmarks, each against two server configurations started one after another,
# on the default model, and prints the tables. Usage: benchmarks/run_scheduler_benchmarks.sh [prompt_tokens]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}; PORT=${PORT:-8031}; BIN=${BIN:-.venv/bin}
serve() {  # serve <args...>: start a server, wait until ready
  : > /tmp/tinyvllm-bench.log  # truncate before starting, so the wait below cannot see the last server's line
  DEV=${DEV:-CPU} "$BIN/tinyvllm" serve --port "$PORT" --max-model-len 4096 --warmup-before-serving "$@" > /tmp/tinyvllm-bench.log 2>&1 &
  SERVER=$!
  until grep -q "tinyvllm ready" /tmp/tinyvllm-bench.log; do sleep 1; kill -0 $SERVER; done
}
stop() { kill -TERM $SERVER; wait $SERVER || true; }
echo "long-prompt: a ${N}-token prompt arrives while one request streams; a short request follows it (medians, seconds)"
echo "| configuration | short request TTFT | long prompt TTFT | longest gap in the running stream |"
echo "|---|---|---|---|"
serve --max-num-batched-tokens 128;  "$BIN/python" benchmarks/bench_scheduler.py long-prompt --url http://127.0.0.1:$PORT --prompt-tokens "$N" --label "chunked prefill (budget 128)"; stop
serve --max-num-batched-tokens 1024; "$BIN/python" benchmarks/bench_scheduler.py long-prompt --url http://127.0.0.1:$PORT --prompt-tokens "$N" --label "whole prompt in one step (budget 1024)"; stop
echo
echo "shared-prefix: requests sharing a ${N}-token prefix, one after another (seconds)"
echo "| configuration | first request TTFT | later requests TTFT (median) |"
echo "|---|---|---|"
serve;                      "$BIN/python" benchmarks/bench_scheduler.py shared-prefix --url http://127.0.0.1:$PORT --prompt-tokens "$N" --label "prefix caching on"; stop
serve --no-prefix-caching;  "$BIN/python" benchmarks/bench_scheduler.py shared-prefix --url http://127.0.0.1:$PORT --prompt-tokens "$N" --label "prefix caching off"; stop
