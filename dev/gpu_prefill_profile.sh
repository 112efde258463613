#!/usr/bin/env bash
# Where a prefill layer's time goes, GEMMs included: Nsight Compute times every launch of one prompt's prefill
# (`mambacpp bench -p P -g 1 -r 1`), then the launches are cut into layers at each block RMSNorm and every kernel's
# median over the layers is printed with the layer's total. The window opens at the second multi-token SSD or Mamba-1
# scan call (the CUDA backend calls cudaProfilerStart there, src/backend/cuda/backend_ssm.cpp, which ncu's
# --profile-from-start off waits for): past the load-time launches (weight conversions) and the first layer, whose
# GEMMs probe their plans (gemm_lt.h), so every layer in it is a steady one.
# Usage: gpu_prefill_profile.sh MAMBACPP [SHAPE] [PROMPT] [LOGDIR]   env: COUNT (launches, 1000)
set -uo pipefail
cli=$1 shape=${2:-mamba2-2.7b} prompt=${3:-8192} log=${4:-${OUT:-/tmp}}
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
csv="$log/ncu_prefill_${shape}_p$prompt.csv"
timeout "${TIMEOUT:-300}" "$ncu_bin" --profile-from-start off \
  --clock-control none --metrics gpu__time_duration.sum --csv --page raw --launch-count "${COUNT:-1000}" \
  "$cli" bench --device cuda -g 1 -r 1 --shape "$shape" -p "$prompt" >"$csv" 2>"$csv.err"
echo "ncu rc=$? ($csv)"
python3 - "$csv" "$prompt" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if len(rows) < 3:
    sys.exit("no launches profiled: see the .err file")
head = rows[0]
name_i, grid_i = head.index("Kernel Name"), head.index("Grid Size")
dur_i = head.index("gpu__time_duration.sum")
unit = rows[1][dur_i]  # the units row
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1.0)
launches = [(r[name_i], r[grid_i], float(r[dur_i].replace(",", "")) * scale) for r in rows[2:]]
# A layer starts at its block RMSNorm (the norm written as in_proj's bf16 input).
starts = [i for i, (n, _, _) in enumerate(launches) if "rmsnorm" in n and "<0" in n]
if len(starts) < 3:
    sys.exit(f"{len(launches)} launches, {len(starts)} layer starts: no prefill in the window")
layers = [launches[a:b] for a, b in zip(starts, starts[1:])]
shape = [n for n, _, _ in layers[0]]
same = [l for l in layers if [n for n, _, _ in l] == shape]  # the middle layers (the last one runs into the head)
print(f"{len(launches)} launches, {len(layers)} layer spans, {len(same)} with the first one's kernels; us per layer "
      f"at {sys.argv[2]} tokens (median over those layers):")
total = 0.0
for k, (n, g, _) in enumerate(layers[0]):
    med = statistics.median(l[k][2] for l in same)
    total += med
    print(f"{med:10.1f}  {g:>14}  {n[:100]}")
print(f"{total:10.1f}  per layer ({total * 2048 / int(sys.argv[2]):.1f} per 2,048 tokens)")
PY
