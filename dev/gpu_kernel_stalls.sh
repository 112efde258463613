#!/usr/bin/env bash
# Why one prefill kernel takes its time: Nsight Compute's full set (warp states, source counters with PC sampling,
# scheduler, memory) on one launch of the kernel matching KERNEL (a regex) in a prompt's prefill, the window opened
# past the first layer as in gpu_prefill_profile.sh. Prints the details page's headline sections, then the SASS
# instructions with the most stall samples and the stall reasons they sum to. The report stays under LOGDIR for the
# GUI. Usage: gpu_kernel_stalls.sh MAMBACPP SHAPE PROMPT KERNEL [LOGDIR]   env: SKIP (launches of KERNEL skipped in
# the window, default 3), EXTRA_ENV (NAME=VALUE for the run)
set -uo pipefail
cli=$1 shape=$2 prompt=$3 kernel=$4 log=${5:-${OUT:-/tmp}}
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
rep="$log/stalls_${shape}_p${prompt}"
env ${EXTRA_ENV:-} timeout "${TIMEOUT:-300}" "$ncu_bin" --profile-from-start off \
  --clock-control none -k "regex:$kernel" --launch-skip "${SKIP:-3}" --launch-count 1 --set full \
  --import-source no -f -o "$rep" "$cli" bench --device cuda -g 1 -r 1 --shape "$shape" -p "$prompt" \
  >"$rep.log" 2>&1
echo "ncu rc=$? ($rep.ncu-rep)"; grep -E "==(PROF|WARNING|ERROR)==" "$rep.log" | head -5
"$ncu_bin" -i "$rep.ncu-rep" --page details >"$rep.details.txt" 2>&1
grep -E "^  [A-Za-z].*|Duration|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Issued Ipc|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Memory Throughput|DRAM Throughput|L2 Hit|Compute \(SM\) Throughput|Executed Instructions " \
  "$rep.details.txt" | head -60
"$ncu_bin" -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.source.csv" 2>&1 ||
  echo "(no source page: $(head -c 300 "$rep.source.csv"))"
python3 - "$rep.source.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head_i = next((i for i, r in enumerate(rows) if any("Warp Stall Sampling" in c for c in r)), None)
if head_i is None:
    sys.exit("no stall sampling columns in the source page (see the .ncu-rep in the GUI)")
head, body = rows[head_i], [r for r in rows[head_i + 1:] if len(r) == len(rows[head_i])]
col = {c: i for i, c in enumerate(head)}
def num(r, c):
    try:
        return float(r[col[c]].replace(",", ""))
    except (KeyError, ValueError):
        return 0.0
allc = next(c for c in head if c.startswith("Warp Stall Sampling (All"))
src = next((c for c in head if c in ("Source", "# Source")), head[1])
total = sum(num(r, allc) for r in body) or 1.0
print(f"\n{len(body)} SASS instructions, {total:.0f} stall samples; the top 40:")
for r in sorted(body, key=lambda r: -num(r, allc))[:40]:
    print(f"{100 * num(r, allc) / total:6.2f}%  {r[col[src]][:110]}")
reasons = [c for c in head if c.startswith("stall_") or c.startswith("smsp__pcsamp_warps_issue_stalled")]
if reasons:
    sums = sorted(((sum(num(r, c) for r in body), c) for c in reasons), reverse=True)
    print("\nby stall reason:")
    for v, c in sums[:12]:
        print(f"{100 * v / total:6.2f}%  {c}")
PY
