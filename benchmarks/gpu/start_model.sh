#!/usr/bin/env bash
# The demo's start model, trained on one GPU in under 10 minutes: the prepared run for a device
# machine (see the device tool's notes; untested until one is at hand: no GPU was lent when it was
# written). A real swarm on 127.0.0.1, as on a CPU: a bootstrap and one swarm-peer per block, every
# peer on the GPU at a large batch, then the fetched model written as the start model and scored.
#
#   bash benchmarks/gpu/start_model.sh            # from the repository root, in the project's venv
#   OUT=/tmp/x STEPS=4000 BATCH=256 bash benchmarks/gpu/start_model.sh
#
# It writes the start model into swarm/cli/demo_start (commit it only if it scores better than the
# shipped one: benchmarks/results/start_model) and its figures under $OUT.
set -euo pipefail
OUT=${OUT:-/tmp/gpu-start}
STEPS=${STEPS:-4000}   # per block; four peers share the GPU
BATCH=${BATCH:-256}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 540 swarm-demo --fresh --device cuda --batch-size "$BATCH" --steps "$STEPS" --timeout 500 \
  --workdir "$OUT/demo" --save-start swarm/cli/demo_start --json > "$OUT/demo.json"
python benchmarks/start_model.py --out "$OUT/start_model" | tail -40
