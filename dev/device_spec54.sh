#!/usr/bin/env bash
# Short pieces as decode steps (branches spec54/spec54b, issues 53/54), after the lead's build, from the repo root,
# <= 90 s. Its A/B is decided (docs/perf-log/decided-experiments.md): fast precision's pure Mamba-2 runs all short
# pieces as ONE decode forward (the step kernels looping over each one's tokens); other cases as successive decode
# forwards. The rows below check exactness and speed of the route kept.
#   1. the GPU tests: GpuStepPieces.* (a piece of k <= 16 tokens == k decode steps: logits memcmp, state bytes; beside
#      a long prompt and decode rows; LastLogits and forward_top_k), GpuSpeculative.* (both precisions, exact tokens,
#      self-draft accepts all);
#   2. speculative rows: generate with random-weight mamba2-2.7b, fast precision, batch 1, a 14-token prompt: plain,
#      and drafting for itself (acceptance must be 100% and the tokens hash plain's); last, if time is left, a 224-token prompt (plain, self);
#   3. bench rows mamba2-2.7b b1 -p 16 -g 64 (the 16-token prompt is a short piece: one decode forward) and
#      -p 4096 -g 1 (long prompts take the prefill kernels).
# Each stage stops at the BUDGET (88 s). Details under $OUT/spec54/; a summary on stdout.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp}/spec54; mkdir -p "$LOG"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
t0=$SECONDS
left() { echo $(( ${BUDGET:-88} - (SECONDS - t0) )); }
cap() { local l; l=$(left); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }  # cap N: seconds for a stage, at most N
timeout 5 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

# 1. tests
# (the GPU suite of the same call runs GpuBatchInvariance.* and GpuEngine.*; here the two suites of this branch)
timeout "$(cap 35)" "$B/tests/mambacpp_gpu_tests" \
  --gtest_filter='*GpuStepPieces.*:*GpuSpeculative.*' \
  --gtest_output=xml:"$LOG/tests.xml" > "$LOG/tests.txt" 2>&1
echo "tests rc=$? ($((SECONDS - t0)) s)"
grep -E '^\[==========\] [0-9]+ tests? from [0-9]+ test suites? ran' -A100 "$LOG/tests.txt" | grep -v '^ *$' | head -40 \
  || tail -5 "$LOG/tests.txt"  # a timeout: the last lines say where
grep -A4 ': Failure' "$LOG/tests.txt" | head -30

# 2. speculative rows (mamba2-2.7b target drafting for itself)
W=/tmp/spec54_w; mkdir -p "$W"
if [ "$(left)" -gt 30 ] && [ ! -f "$W/t27/config.json" ]; then
  timeout "$(cap 30)" python3 dev/random_hf_mamba2.py mamba2-2.7b "$W/t27" > "$LOG/ckpt.txt" 2>&1 || echo "checkpoint failed: $(tail -1 "$LOG/ckpt.txt")"
fi
python3 -c '
import random
rnd = random.Random(0); ids = [rnd.randrange(1000, 50000) for _ in range(192)]
open("/tmp/spec54_w/long.txt", "w").write(" ".join(map(str, ids + ids[:32])))
open("/tmp/spec54_w/short.txt", "w").write(" ".join(map(str, ids[:14])))'
spec() {  # spec NAME PROMPT ARGS...
  local name=$1 prompt=$2; shift 2
  if [ "$(left)" -lt 10 ] || [ ! -f "$W/t27/config.json" ]; then echo "| $name | skipped |"; return; fi
  timeout "$(cap 15)" "$B/mambacpp" generate --device cuda --model "$W/t27" \
    --tokens-file "$W/$prompt.txt" -n 128 --temp 0 --ignore-eos --json "$@" > "$LOG/spec_$name.json" 2> "$LOG/spec_$name.err"
  python3 - "$name" "$LOG/spec_$name.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
if not rows: print(f"| {sys.argv[1]} | failed |"); sys.exit()
r = rows[0]; d, a = r.get("draft_tokens", 0), r.get("accepted_draft_tokens", 0)
print(f"| {sys.argv[1]} | {r['timings']['generate_tokens_per_s']:.1f} tok/s | drafted {d} | accepted {a} | "
      f"{100 * a / d if d else 0:.0f}% | tokens hash {hash(tuple(r['tokens'])) & 0xffff:04x} |")
PY
}
echo "| speculation (mamba2-2.7b, b1, fast) | decode | drafted | accepted | acceptance | hash |"
spec self_short short --draft-model "$W/t27" --draft-max 8
spec none_short short

# 3. bench rows
row() {  # row NAME ARGS...
  local name=$1; shift
  if [ "$(left)" -lt 8 ]; then echo "skipped $name (time)"; return; fi
  local out
  out=$(timeout "$(cap 12)" "$B/mambacpp" bench --device cuda --json --shape mamba2-2.7b -b 1 "$@" \
        2> "$LOG/bench_$name.err" | tail -1)
  echo "$out" > "$LOG/bench_$name.json"
  python3 - "$name" "$out" <<'PY'
import json, sys
try:
    r = json.loads(sys.argv[2])
except Exception:
    print(f"{sys.argv[1]:14} failed"); sys.exit()
nan = float("nan")
print(f"{sys.argv[1]:14} prefill {r.get('prefill_ms', nan):9.2f} ms  decode {r.get('decode_ms_per_step', nan):7.3f} ms/step")
PY
}
row p16 -p 16 -g 64 -r 3
row p4096 -p 4096 -g 1 -r 2
# If time is left: the 224-token prompt, whose target prefill (224) and draft catch-up (225) are two splits.
spec none_long long
spec self_long long --draft-model "$W/t27" --draft-max 8
echo "total $((SECONDS - t0)) s"
