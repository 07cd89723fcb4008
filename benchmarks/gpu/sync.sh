#!/usr/bin/env bash
# DeMo on a GPU, in one call of about 5 minutes (issue 47): the prepared run for a device machine
# (untested until one is at hand: none was lent when it was written).
# - scale.py at 52 M parameters (1024x3) on the GPU, at the peer's batch (32) and at 512, with the
#   per-part timings of DeMo (compress, encode, decode, apply) beside the forward and backward pass;
# - the two-replica swarm: benchmarks/gpu_replicas.py (two DeMo replicas of block 0 and a peer of
#   block 1, as processes on the GPU; replicas bit-identical, fetched model equal to the
#   checkpoints, generation through the peers equal to local).
# Each part writes its JSON as it goes under $OUT, so a run cut short keeps what it measured.
#
#   bash benchmarks/gpu/sync.sh          # from the repository root, in the project's venv
set -uo pipefail
OUT=${OUT:-/tmp/gpu-sync}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
timeout 150 python benchmarks/scale.py --device cuda --threads 16 --sizes 1024x3 --batch-size 32 \
  --out "$OUT/scale_batch32" > "$OUT/scale_batch32.log" 2>&1 || status=1
timeout 150 python benchmarks/scale.py --device cuda --threads 16 --sizes 1024x3 --batch-size 512 \
  --out "$OUT/scale_batch512" > "$OUT/scale_batch512.log" 2>&1 || status=1
timeout 240 python benchmarks/gpu_replicas.py --device cuda --out "$OUT/replicas" > "$OUT/replicas.log" 2>&1 || status=1
tail -5 "$OUT"/*.log
exit $status
