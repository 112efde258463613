#!/usr/bin/env bash
# Where the time of a decode step goes: Nsight Compute's per-kernel summary (durations) over a short eager run of
# `mambacpp bench` (CUDA graphs off, so every kernel is launched and timed on its own; prefill of 8 tokens takes the
# same GEMV path as decode). Usage: gpu_profile.sh MAMBACPP SHAPE [LOGDIR] [BATCH]; NCU_LAUNCHES=N profiles the first N
# kernels only (a large model's whole run takes minutes under ncu).
set -euo pipefail
cli=$1 shape=$2 log=${3:-${OUT:-/tmp}} batch=${4:-1}
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
"$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel --launch-count "${NCU_LAUNCHES:-100000}" \
  "$cli" bench --device cuda --shape "$shape" -b "$batch" -p 8 -g 2 -r 1 --no-cuda-graph >"$log/ncu_${shape}_b$batch.txt" 2>&1
# Condense: kernel name, invocations, average duration.
python3 - "$log/ncu_${shape}_b$batch.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rows = []
for block in re.split(r"\n(?=\s*\S.*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", text):
    head = block.strip().splitlines()[0] if block.strip() else ""
    m = re.search(r"Invocations\s*[:=]?\s*(\d+)", block) or re.search(r"(\d+)\s+invocations", block)
    d = re.search(r"gpu__time_duration\.sum\s+\S+\s+([\d.,]+)\s+([\d.,]+)\s+([\d.,]+)", block)
    if head and d:
        rows.append((head[:90], m.group(1) if m else "?", d.group(2)))
for r in rows:
    print(f"{r[1]:>6}  avg {r[2]:>10}  {r[0]}")
PY
grep -cE "^\s+\S+.*\(\d+, \d+, \d+\)x" "$log/ncu_${shape}_b$batch.txt" >/dev/null || tail -c 3000 "$log/ncu_${shape}_b$batch.txt"
