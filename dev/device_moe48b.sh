#!/usr/bin/env bash
# Issue 48's MoE GPU work, phase 2 rows (from the repository root, after the build; binaries in build-gpu/): the
# granite-4.0-h-tiny decode rows that docs/benchmarks.md records, with their floors (the chosen experts' bytes).
#   b32 first: it is the row phase 2 changes (9+ tokens back on the sorted one-warp-per-row kernel; phase 1 had
#   19.599 ms/step there, the kernel before it 15.893). -r 1: the row took 34 s at -r 3 in phase 1, too long beside b1
#   in 45 s. Then b1 (its path is phase 1's: 3.561 ms/step) in the time left.
# Each row prints its load time and wall time (the b32 row spent ~17 s outside its load and timed rounds in phase 1).
# <= 45 s. Details under $OUT/moe48b/.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp}/moe48b
mkdir -p "$LOG"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -d "$B/devlibs" ] && export LD_LIBRARY_PATH=$B/devlibs:$LD_LIBRARY_PATH
t0=$SECONDS
BUDGET=${BUDGET:-44}
summary=()

# row NAME LIMIT ARGS...: one bench run of granite-4.0-h-tiny (JSON in $LOG/NAME.json, stderr in $LOG/NAME.err).
row() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - (SECONDS - t0)))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    summary+=("$(printf '%-10s skipped (%s s left)' "$name" "$left")")
    return
  fi
  local t=$SECONDS
  timeout "$limit" "$B/mambacpp" bench --device cuda --json --shape granite-4.0-h-tiny "$@" \
    > "$LOG/$name.json" 2> "$LOG/$name.err"
  local rc=$?
  local r
  r=$(python3 - "$LOG/$name.json" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    print("no JSON"); sys.exit()
print(f'{j["decode_ms_per_step"]:.3f} ms/step, floor {j["decode_floor_ms_per_step"]:.3f} '
      f'({j["decode_floor_percent"]:.0f}%); load {j["load_ms"] / 1000:.1f} s, prefill {j["prefill_ms"]:.1f} ms')
PY
)
  summary+=("$(printf '%-10s rc=%-3s limit %2ss wall %2ss  %s' "$name" "$rc" "$limit" $((SECONDS - t)) "$r")")
  [ "$rc" -eq 0 ] || tail -3 "$LOG/$name.err"
}

timeout 5 nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$LOG/gpu.txt"
row tiny_b32 ${B32_LIMIT:-29} -b 32 -p 16 -g 64 -r 1
row tiny_b1 ${B1_LIMIT:-20} -b 1 -p 16 -g 64 -r 3

echo "== summary ($((SECONDS - t0)) s; phase 1 (H100): b1 3.561 ms/step (floor 1.064), b32 19.599 (6.018);"
echo "   the kernel before it: b1 4.228 (1.066), b32 15.893 (5.961))"
printf '%s\n' "${summary[@]}"
