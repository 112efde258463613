#!/usr/bin/env bash
# Issue 53: speculation rows of two engines in one GPU job, NEW (this tree) then OLD (the engine files in $OLD_DIR,
# e.g. `for f in engine.cpp speculative.cpp speculative.h; do git show e79bfe8:src/engine/$f > old/$f; done`),
# greedy, 128 tokens, batch 8 and 1, the tail x0.25 target drafted by its first 8 layers and by itself, plain
# beside. From the repository root with .deps (build_from_debs.sh, debs); OUT for the logs. It overwrites src/engine/
# with OLD's files for the second build: run it on a copy of the tree (the device machine's).
set -u -o pipefail
OLD_DIR=${OLD_DIR:-.devjobs/old}; OUT=${OUT:-/tmp/device_spec53}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
t0=$SECONDS

nvidia-smi --query-gpu=name --format=csv,noheader
build() { bash .deps/build_from_debs.sh build .deps/debs . build-gpu -DMAMBACPP_CUDA=ON -DMAMBACPP_NATIVE=OFF \
  -DMAMBACPP_PYTHON=OFF -- mambacpp_cli $2 > "$OUT/build_$1.log" 2>&1 || { grep -E "error" "$OUT/build_$1.log" | head; exit 1; }; }
build new mambacpp_gpu_tests
echo "build $((SECONDS - t0)) s"
timeout 90 build-gpu/tests/mambacpp_gpu_tests --gtest_filter="*GpuSpeculative*:*GpuEngine*:*GpuStepPieces*" --gtest_brief=1 2>&1 | grep -E "FAILED|PASSED" | head
echo "build $((SECONDS - t0)) s"
W=build-gpu/w; t=$W/t27; mkdir -p $W
[ -f $t/config.json ] || timeout 60 python3 dev/random_hf_mamba2.py mamba2-2.7b "$t" > /dev/null 2>&1
[ -f $t-l8/config.json ] || timeout 40 python3 scripts/make_layer_skip_draft.py "$t" 8 "$t-l8" > /dev/null 2>&1
[ -f $t-s0.25/config.json ] || timeout 60 python3 scripts/make_layer_skip_draft.py --tail-scale 0.25 "$t" 8 "$t-s0.25" > /dev/null 2>&1
[ -f $W/p7.txt ] || python3 -c '
import random
for b in range(8):
    rnd = random.Random(b); ids = [rnd.randrange(1000, 50000) for _ in range(192)]
    open(f"build-gpu/w/p{b}.txt", "w").write(" ".join(map(str, ids + ids[:32])))'
echo "models at $((SECONDS - t0)) s"
row() {  # tag name target batch args...
  local tag=$1 name=$2 tg=$3 batch=$4; shift 4; local files=()
  for b in $(seq 0 $((batch - 1))); do files+=(--tokens-file $W/p$b.txt); done
  timeout 60 build-gpu/mambacpp generate --device cuda --model "$tg" "${files[@]}" -n 128 --temp 0 --ignore-eos --json "$@" 2>$OUT/err_${tag}_${name}_${batch}.txt \
    | python3 -c '
import json, sys
rs = [json.loads(l) for l in sys.stdin if l.startswith("{")]
if not rs: print(sys.argv[1], "failed"); sys.exit()
tps = sum(r["timings"]["generate_tokens_per_s"] for r in rs); d = sum(r["draft_tokens"] for r in rs); a = sum(r["accepted_draft_tokens"] for r in rs)
h = hash(tuple(tuple(r["tokens"]) for r in rs)) & 0xffff
print(f"{sys.argv[1]:20} b{len(rs)} {tps:9.1f} tok/s drafted {d:5} accepted {a:5} ({100*a/max(d,1):.0f}%) hash {h:04x}")' "$tag $name"

}
rows() {
  row $1 plain "$t-s0.25" 8; row $1 l8draft "$t-s0.25" 8 --draft-model "$t-l8"
  row $1 plain "$t-s0.25" 1; row $1 l8draft "$t-s0.25" 1 --draft-model "$t-l8"; row $1 self "$t-s0.25" 1 --draft-model "$t-s0.25"
}
rows new
echo "new rows at $((SECONDS - t0)) s"
cp "$OLD_DIR"/engine.cpp src/engine/engine.cpp; cp "$OLD_DIR"/speculative.cpp src/engine/speculative.cpp; cp "$OLD_DIR"/speculative.h src/engine/speculative.h


build old ""
echo "old build at $((SECONDS - t0)) s"
rows old
echo "total $((SECONDS - t0)) s"
