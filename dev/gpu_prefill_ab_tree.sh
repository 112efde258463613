#!/usr/bin/env bash
# A/B of two source trees in one GPU run: this tree ("new") and this tree with PATCH reversed ("base"; a copy of the
# source tree on the GPU machine may have no .git, so make the patch beforehand and ship it with the tree, e.g.
# `git diff BASE_REF -- src > ab.patch`). Both are built side by side, then the GPU tests on the new tree, then the
# prefill rows alternately (base, new, base, new: clocks drift under sustained load,
# docs/perf-log/benchmarks-2026-12.md q16), then the new tree's layer profile at 8,192 tokens. Logs under $OUT. ~4-5 minutes on the GPU machine.
# Usage: gpu_prefill_ab_tree.sh PATCH [BUILD_DIR]   env: ROUNDS (2), NOTESTS=1 skips the tests, NOPROFILE=1 the
# profile, ROWS (bench arguments of each row, separated by ';')
set -u -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # dev/; the product's drivers are in ../scripts
patch_file=$(realpath "$1") B=${2:-build-gpu}
LOG=${OUT:-/tmp/gpu_prefill_ab_tree}; mkdir -p "$LOG"
base=/tmp/ab_base
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
rm -rf "$base" && mkdir -p "$base"
tar cf - --exclude="./$B" --exclude=./.git . | tar xf - -C "$base"
(cd "$base" && patch -s -R -p1 < "$patch_file") || { echo "the patch does not reverse on this tree"; exit 1; }
bash .deps/build_from_debs.sh build .deps/debs . "$B" -DMAMBACPP_CUDA=ON -DMAMBACPP_NATIVE=OFF -DMAMBACPP_PYTHON=OFF \
  -- mambacpp_gpu_tests mambacpp_cli > "$LOG/build.log" 2>&1 || { tail -40 "$LOG/build.log"; exit 1; }
# The base tree against the prefix that build just unpacked (build_from_debs.sh would unpack it again, deleting the
# libraries the new tree's tests run with), in the background while they run.
D=/tmp/deps/usr
(export PKG_CONFIG_PATH=$D/lib/x86_64-linux-gnu/pkgconfig:$D/share/pkgconfig
 cmake -S "$base" -B "$base/$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=$D \
   -DGTest_DIR=$D/lib/x86_64-linux-gnu/cmake/GTest -Dnlohmann_json_DIR=$D/share/cmake/nlohmann_json \
   -DCLI11_DIR=$D/share/cmake/CLI11 -DMAMBACPP_CUDA=ON -DMAMBACPP_NATIVE=OFF -DMAMBACPP_PYTHON=OFF &&
 cmake --build "$base/$B" -j "$(nproc)" --target mambacpp_cli) > "$LOG/build_base.log" 2>&1 &
base_build=$!
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
echo "build $((SECONDS - t0)) s"
if [ "${NOTESTS:-0}" != 1 ]; then
  timeout 240 "$B/tests/mambacpp_gpu_tests" --gtest_brief=1 > "$LOG/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^\[  FAILED|PASSED" "$LOG/tests.log" | head -20
fi
wait $base_build || { echo "base build failed"; tail -40 "$LOG/build_base.log"; exit 1; }
echo "builds and tests $((SECONDS - t0)) s"
default_rows="--shape mamba2-2.7b -p 16384;--shape mamba2-2.7b -p 4096"
default_rows+=";--shape mamba2-2.7b -b 32 -p 512 --state-dtype bf16;--shape mamba2-130m -p 4096"
IFS=';' read -r -a rows <<< "${ROWS:-$default_rows}"
row() {  # binary, bench args...
  timeout 120 "$1" bench --device cuda -g 1 -r 3 --json "${@:2}" 2>&1 | grep '^{' | tail -1 |
    python3 -c "import json, sys; j = json.load(sys.stdin); print(f\"{j['prefill_tokens_per_s']:10.0f} tokens/s\")"
}
for ((round = 1; round <= ${ROUNDS:-2}; ++round)); do
  for tree in base new; do
    bin=$B/mambacpp; [ $tree = base ] && bin=$base/$B/mambacpp
    for r in "${rows[@]}"; do
      read -r -a args <<< "$r"
      echo "$tree  $r: $(row "$bin" "${args[@]}")"
    done
  done
done
echo "bench $((SECONDS - t0)) s"
if [ "${NOPROFILE:-0}" != 1 ]; then
  TIMEOUT=120 bash "$here/gpu_prefill_profile.sh" "$B/mambacpp" mamba2-2.7b 8192 "$LOG" | tail -14
fi
echo "total $((SECONDS - t0)) s"
