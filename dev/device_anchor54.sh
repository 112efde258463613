#!/usr/bin/env bash
# Issue 54 part 3 (branch anchor54): mamba_ssm's decode beside mambacpp's, in one GPU job. From the repo root on the
# GPU machine after the lead's build (build-gpu/mambacpp), with mamba_ssm's sources at .deps/anchor_src (SRC=...;
# dev/mamba_ssm_anchor_common.py says how they are made). Expected 5-6 minutes on an H100, over issue 54's ~300 s
# (stage 3 is mostly Triton compiling mamba_ssm's kernels on a fresh machine; ROUND2=0 saves stage 4's ~75 s); every
# stage under a timeout, the whole under BUDGET=540 s:
#   1. in the background: causal-conv1d's forward + update kernels for mamba_ssm, built for sm_90 and checked against
#      the package's references (`dev/mamba_ssm_decode_anchor.py SRC --build-only`; ~1.5-2.5 min on 16 cores);
#   2. meanwhile mambacpp's rows, round 1: `mambacpp bench --device cuda --json -r 3` with scripts/gpu_decode_bench.sh's
#      arguments (m2_130m, m2_2p7_b1, m2_2p7_b1_bf16, m2_2p7_b32, m2_2p7_b128, m1_2p8_b1) and m1_2p8_b1 with
#      `--state-dtype bf16` (mamba_ssm's state is bf16); ~10 s a row, mostly drawing the random weights; the build
#      takes at most 4 of the 16 cores;
#   3. mamba_ssm's rows once the build is done (dev/mamba_ssm_decode_anchor.py: generate(cg=True), ms/token from two
#      lengths, the 130m row's end-to-end total; ~1.5-2.5 min, most of it Triton compiling on the first prompts);
#   4. mambacpp's rows again, round 2 (after mamba_ssm: the two engines alternate), while the budget lasts;
#   5. one table: mambacpp (round 2, else round 1), mamba_ssm, ratio = mamba_ssm / mambacpp (> 1: mambacpp faster),
#      the bench's floor and each engine's % of it.
# A row that fails prints why and the rest go on. Details under $OUT/anchor54/: build.txt, anchor.txt (mamba_ssm's
# output and tracebacks), anchor.jsonl, ours.jsonl, ours_err.txt.
set -u -o pipefail
B=${B:-build-gpu}
SRC=${SRC:-.deps/anchor_src}
LOG=${OUT:-/tmp}/anchor54; mkdir -p "$LOG"
t0=$SECONDS
left() { echo $(( ${BUDGET:-540} - (SECONDS - t0) )); }
cap() { local l; l=$(left); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }  # cap N: at most N s
# mambacpp's runtime libraries only for mambacpp (the Python side keeps torch's own CUDA libraries).
MC_LD=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:$PWD/$B/devlibs
timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1
: > "$LOG/ours.jsonl"; : > "$LOG/ours_err.txt"; rm -f "$LOG/anchor.jsonl"

# 1. the anchor's build, in the background
tb=$SECONDS
timeout "$(cap 330)" python3 dev/mamba_ssm_decode_anchor.py "$SRC" --build-only > "$LOG/build.txt" 2>&1 &
build_pid=$!

# 2. mambacpp, round 1
ours() {  # ours ROUND NAME ARGS...: one JSON line into ours.jsonl
  local round=$1 name=$2; shift 2
  if [ "$(left)" -lt 25 ]; then echo "ours $name round $round: skipped (time)"; return; fi
  local j rc
  j=$(LD_LIBRARY_PATH=$MC_LD timeout "$(cap 60)" "$B/mambacpp" bench --device cuda --json -r 3 "$@" \
      2> "$LOG/last.err" | tail -1)
  rc=$?
  { echo "== $name round $round rc=$rc"; cat "$LOG/last.err"; } >> "$LOG/ours_err.txt"
  if [ $rc -ne 0 ] || [[ "$j" != "{"* ]]; then
    echo "ours $name round $round: failed rc=$rc $(tail -c 300 "$LOG/last.err")"; return
  fi
  echo "{\"row\":\"$name\",\"round\":$round,${j#\{}" >> "$LOG/ours.jsonl"
}
round() {
  local r=$1 t=$SECONDS
  ours "$r" m2_130m        --shape mamba2-130m -b 1 -p 100 -g 1000
  ours "$r" m2_2p7_b1      --shape mamba2-2.7b -b 1 -p 16 -g 200
  ours "$r" m2_2p7_b1_bf16 --shape mamba2-2.7b -b 1 -p 16 -g 200 --state-dtype bf16
  ours "$r" m2_2p7_b32     --shape mamba2-2.7b -b 32 -p 16 -g 64 --state-dtype bf16
  ours "$r" m2_2p7_b128    --shape mamba2-2.7b -b 128 -p 16 -g 64 --state-dtype bf16
  ours "$r" m1_2p8_b1      --shape mamba-2.8b -b 1 -p 16 -g 200
  ours "$r" m1_2p8_b1_bf16 --shape mamba-2.8b -b 1 -p 16 -g 200 --state-dtype bf16
  echo "mambacpp round $r: $((SECONDS - t)) s"
}
round 1

wait "$build_pid"
build_rc=$?
echo "causal_conv1d build: rc=$build_rc; waited for it until $((SECONDS - tb)) s after its start (its own seconds below)"
grep -E '^causal_conv1d' "$LOG/build.txt"
[ $build_rc -ne 0 ] && tail -25 "$LOG/build.txt"

# 3. mamba_ssm
if [ $build_rc -eq 0 ] && [ "$(left)" -gt 60 ]; then
  ta=$SECONDS
  # keep 80 s for round 2 where the budget allows it
  l=$(( $(left) - 80 )); [ $l -lt 60 ] && l=$(left)
  timeout "$(cap "$l")" python3 dev/mamba_ssm_decode_anchor.py "$SRC" --json "$LOG/anchor.jsonl" > "$LOG/anchor.txt" 2>&1
  echo "mamba_ssm: rc=$?, $((SECONDS - ta)) s"
  grep -E '^(#|mamba_ssm|causal_conv1d)' "$LOG/anchor.txt"
  grep -qE '^mamba_ssm .* failed|Traceback' "$LOG/anchor.txt" && grep -E 'Error|error' "$LOG/anchor.txt" | tail -5
else
  echo "mamba_ssm: skipped (build rc=$build_rc, $(left) s left)"
fi

# 4. mambacpp, round 2
if [ "${ROUND2:-1}" = 1 ] && [ "$(left)" -gt 60 ]; then round 2; else echo "mambacpp round 2: skipped"; fi
rm -f "$LOG/last.err"

# 5. the table
python3 - "$LOG/ours.jsonl" "$LOG/anchor.jsonl" <<'PY'
import json, os, sys
ours = {}
def rows(path):
    for line in open(path) if os.path.exists(path) else []:
        try:
            yield json.loads(line)
        except ValueError:
            print("unparsed line in", path, line[:100])
for j in rows(sys.argv[1]):
    ours.setdefault(j["row"], {})[j["round"]] = j
anchor = {j["row"]: j for j in rows(sys.argv[2])}
# (our row, mamba_ssm's row): mamba_ssm's state is always bf16
pairs = [("m2_130m", "m2_130m"), ("m2_2p7_b1", "m2_2p7_b1"), ("m2_2p7_b1_bf16", "m2_2p7_b1"),
         ("m2_2p7_b32", "m2_2p7_b32"), ("m2_2p7_b128", "m2_2p7_b128"), ("m1_2p8_b1", "m1_2p8_b1"),
         ("m1_2p8_b1_bf16", "m1_2p8_b1")]
f = lambda v, p=4: "-" if v is None else f"{v:.{p}f}"
print("ratio = mamba_ssm / mambacpp (> 1: mambacpp faster); mambacpp = round 2 where it ran, else round 1 (*)")
print(f"{'row':16} {'unit':8} {'state':5} {'ours r1':>9} {'ours r2':>9} {'mamba_ssm':>9} {'ratio':>6} "
      f"{'floor':>7} {'ours %fl':>8} {'ssm %fl':>7}")
for mine, theirs in pairs:
    r = ours.get(mine, {})
    a = anchor.get(theirs, {})
    if "error" in a:
        print(f"{'':16} mamba_ssm {theirs} failed: {a['error'][:150]}")
    best = r.get(2) or r.get(1)
    star = "" if 2 in r or not r else "*"
    floor = best["decode_floor_ms_per_step"] if best else None
    state = best["state_dtype"] if best else "-"
    lines = [("ms/token", lambda j: j["decode_ms_per_step"], a.get("ms_per_token"))]
    if mine == "m2_130m":  # the report's workload: prompt 100 + 1000 tokens, end to end
        lines.insert(0, ("s total", lambda j: j["total_ms"] / 1e3, a.get("total_s")))
    for unit, get, theirs_v in lines:
        o1 = get(r[1]) if 1 in r else None
        o2 = get(r[2]) if 2 in r else None
        o = o2 if o2 is not None else o1
        ratio = f"{theirs_v / o:.2f}{star}" if o and theirs_v else "-"
        per_step = unit == "ms/token"
        pf = lambda v: f"{100 * floor / v:.1f}" if per_step and floor and v else "-"
        print(f"{mine:16} {unit:8} {state:5} {f(o1):>9} {f(o2):>9} {f(theirs_v):>9} {ratio:>6} "
              f"{f(floor) if per_step else '-':>7} {pf(o):>8} {pf(theirs_v):>7}")
for k, a in anchor.items():
    if a.get("conv_check", "ok") != "ok":
        print(f"WARNING: mamba_ssm {k}: causal_conv1d's kernels against the package's references: {a['conv_check']}")
    if "same_tokens" in a and not a["same_tokens"]:
        print(f"note: mamba_ssm {k}: the N1 call's tokens were not a prefix of the N2 call's")
dev = next((j["device"] for r in ours.values() for j in r.values()), None)
print(f"mambacpp device: {dev}; mamba_ssm device: {next((a['device'] for a in anchor.values()), None)}")
PY
echo "all $((SECONDS - t0)) s"
