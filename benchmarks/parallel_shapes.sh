#!/usr/bin/env bash
# tinyvllm serving the default model in several worker shapes, one after the other, each loaded the same way by
# `tinyvllm bench serve` (benchmarks/compare.sh, tinyvllm only), then one markdown table: output tok/s and TTFT p50
# per concurrency level, and what meeting the other workers cost per step (the workers log it when they stop).
#
#   benchmarks/parallel_shapes.sh                                   # the shapes below, concurrency 1 and 16
#   SHAPES="tp1:|tp3:--tensor-parallel-size 3" benchmarks/parallel_shapes.sh --concurrency 1
#
# SHAPES: "name:flags|name:flags|..." (default: tp1, tp3, pp2, dp2). Other options go to compare.sh.
# The exchange costs are the workers' own per-step averages over the served steps (waits for slower ranks included).
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPES=${SHAPES:-"tp1:|tp3:--tensor-parallel-size 3|pp2:--pipeline-parallel-size 2|dp2:--data-parallel-size 2"}
OUT=${OUT:-benchmarks/results/parallel}
CONCURRENCY=${CONCURRENCY:-1 16}
EXTRA=("$@")
IFS='|' read -r -a shapes <<< "$SHAPES"
for shape in "${shapes[@]}"; do
  [ -z "${TABLE_ONLY:-}" ] || break  # TABLE_ONLY=1: only print the table of the results already in $OUT
  name=${shape%%:*}; flags=${shape#*:}
  echo "== shape $name: tinyvllm serve $flags" >&2
  OUT="$OUT/$name" CONCURRENCY="$CONCURRENCY" TINYVLLM_ARGS="$flags" benchmarks/compare.sh --servers tinyvllm "${EXTRA[@]}" \
    > /dev/null || echo "warning: shape $name failed" >&2
done
source benchmarks/peers/common.sh
"$TINYVLLM_PYTHON" - "$OUT" "$CONCURRENCY" "${shapes[@]}" <<'EOF'
import json, pathlib, re, statistics, sys
sys.path.insert(0, "benchmarks")
from compare_table import records_of
out, levels, shapes = pathlib.Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
head = ["shape", "flags"] + [f"tok/s @{c}" for c in levels] + [f"TTFT p50 @{c} (ms)" for c in levels] + \
       [f"ITL p50 @{c} (ms)" for c in levels] + \
       ["all-reduce ms/step", "stage transfer ms/step"]
print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
for shape in shapes:
    name, flags = shape.split(":", 1)
    rows = {}
    for c in levels:
        f = out / name / f"tinyvllm-c{c}.json"
        rows[c] = (records_of(json.loads(f.read_text())) or [{}])[0] if f.exists() else {}
    log = (out / name / "tinyvllm.log").read_text() if (out / name / "tinyvllm.log").exists() else ""
    costs = re.findall(r"per step ([\d.]+) ms in all-reduces, ([\d.]+) ms in stage transfers", log)
    reduce = f"{statistics.median(float(a) for a, _ in costs):.2f}" if costs else "-"
    transfer = f"{statistics.median(float(b) for _, b in costs):.2f}" if costs else "-"
    cells = [f"{rows[c].get('output_throughput', float('nan')):.1f}" for c in levels] + \
            [f"{rows[c].get('p50_ttft_ms', float('nan')):.0f}" for c in levels] + \
            [f"{rows[c].get('p50_itl_ms', float('nan')):.1f}" for c in levels]
    print("| " + " | ".join([name, f"`{flags}`" if flags else "(one worker)"] + cells + [reduce, transfer]) + " |")
EOF
