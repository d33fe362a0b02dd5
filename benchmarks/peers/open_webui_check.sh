#!/usr/bin/env bash
# Open WebUI against tinyvllm (docs/CLIENTS.md): installs open-webui into its own venv outside the repo, starts
# tinyvllm, a logging proxy in front of it, and Open WebUI with tinyvllm as both its Ollama and its OpenAI
# connection, then drives Open WebUI's REST API (benchmarks/peers/open_webui_drive.py) and prints PASS/FAIL per
# item. Not part of `make test`: the install is ~3 GB and Open WebUI takes a minute to start.
#
#   benchmarks/peers/open_webui_check.sh
#
# Environment: OPEN_WEBUI_SPEC (default open-webui==0.12.4; a wheel path works), TINYVLLM_PORT (8011),
# PROXY_PORT (8012), OPEN_WEBUI_PORT (8013), OUT (requests log and server logs; default
# $TINYVLLM_PEERS_DIR/open-webui-run), KEEP=1 leaves the servers up, TINYVLLM_ARGS (`tinyvllm serve` flags; default
# --default-max-tokens 256: Open WebUI's follow-up and tag tasks set no max_tokens, and the small default model can
# ramble to the end of its 8192-token context, minutes on a CPU; TINYVLLM_ARGS="" shows that).
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/peers/common.sh

OPEN_WEBUI_SPEC=${OPEN_WEBUI_SPEC:-open-webui==0.12.4}
OWUI_VENV=$PEERS_DIR/open-webui-venv
TINYVLLM_PORT=${TINYVLLM_PORT:-8011}; PROXY_PORT=${PROXY_PORT:-8012}; OPEN_WEBUI_PORT=${OPEN_WEBUI_PORT:-8013}
OUT=${OUT:-$PEERS_DIR/open-webui-run}
MODEL=SmolLM2-135M-Instruct

if [ ! -x "$OWUI_VENV/bin/open-webui" ]; then
  python3.11 -m venv "$OWUI_VENV" 2>/dev/null || python3 -m venv "$OWUI_VENV"
  # the CPU torch first (pip's find-links, as setup_vllm.sh), so sentence-transformers does not pull the CUDA build
  nice -n 19 "$OWUI_VENV/bin/pip" install -q "torch==$TORCH_VERSION"
  nice -n 19 "$OWUI_VENV/bin/pip" install -q "$OPEN_WEBUI_SPEC" "torch==$TORCH_VERSION"
fi

rm -rf "$OUT"; mkdir -p "$OUT/data"
pids=()
stop_all() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
[ "${KEEP:-0}" = 1 ] || trap stop_all EXIT

wait_for() {  # URL SECONDS NAME
  for _ in $(seq "$2"); do curl -sf -o /dev/null "$1" && return 0; sleep 1; done
  echo "FAIL  $3 did not answer $1 within $2 s (logs in $OUT)"; exit 1
}

"$TINYVLLM_PYTHON" -m tinyvllm.frontend.cli.main serve --port "$TINYVLLM_PORT" ${TINYVLLM_ARGS---default-max-tokens 256} > "$OUT/tinyvllm.log" 2>&1 &
pids+=($!)
python3 benchmarks/peers/logging_proxy.py "$PROXY_PORT" "http://127.0.0.1:$TINYVLLM_PORT" "$OUT/requests.jsonl" &
pids+=($!)
wait_for "http://127.0.0.1:$TINYVLLM_PORT/health" 300 tinyvllm

# Offline: no model hub, no version check, no embedding model (RAG off), no telemetry.
# ENABLE_PERSISTENT_CONFIG=False: the environment wins over a config saved in DATA_DIR by an earlier run.
env DATA_DIR="$OUT/data" WEBUI_SECRET_KEY=tinyvllm-check OFFLINE_MODE=true HF_HUB_OFFLINE=1 \
  ENABLE_PERSISTENT_CONFIG=False ENABLE_VERSION_UPDATE_CHECK=false BYPASS_EMBEDDING_AND_RETRIEVAL=true \
  RAG_EMBEDDING_ENGINE=openai RAG_EMBEDDING_MODEL_AUTO_UPDATE=false RAG_RERANKING_MODEL_AUTO_UPDATE=false \
  ANONYMIZED_TELEMETRY=false DO_NOT_TRACK=true SCARF_NO_ANALYTICS=true \
  ENABLE_OLLAMA_API=true OLLAMA_BASE_URL="http://127.0.0.1:$PROXY_PORT" \
  ENABLE_OPENAI_API=true OPENAI_API_BASE_URL="http://127.0.0.1:$PROXY_PORT/v1" OPENAI_API_KEY=none \
  "$OWUI_VENV/bin/open-webui" serve --host 127.0.0.1 --port "$OPEN_WEBUI_PORT" > "$OUT/open-webui.log" 2>&1 &
pids+=($!)
wait_for "http://127.0.0.1:$OPEN_WEBUI_PORT/health" 600 "Open WebUI"

status=0
"$OWUI_VENV/bin/python" benchmarks/peers/open_webui_drive.py "http://127.0.0.1:$OPEN_WEBUI_PORT" \
  "$MODEL:latest" "$MODEL" "http://127.0.0.1:$PROXY_PORT" || status=$?
echo "requests Open WebUI sent to tinyvllm ($OUT/requests.jsonl):"
python3 -c 'import collections,json,sys
seen = collections.Counter((r["method"], r["path"], r["status"]) for r in map(json.loads, open(sys.argv[1])))
for (method, path, code), n in sorted(seen.items()): print(f"  {n:3d} x {method} {path} -> {code}")' "$OUT/requests.jsonl"
exit $status
