#!/usr/bin/env bash
# CPU decode and prompt processing side by side: mambacpp (random weights of a real shape, `bench --shape --weights`) and llama.cpp (the
# prebuilt libraries of npm node-llama-cpp@3.21.1, on GGUFs of the same shapes written by make_gguf.mjs), the same
# threads, prompt and decode lengths, interleaved run by run, plus this machine's read bandwidth and f32 FMA peak in
# every block.
# Each (round, shape) block holds the machine's exclusive benchmark lock (flock -x $CPU_LOCK) so that no build runs
# beside it. Results: one JSON line per run in $OUT (default results.jsonl here), then the table (summarise.mjs).
#   scripts/llamacpp_bench/run.sh [--build DIR] [--threads 2] [--rounds 3] [--prompt 64] [--gen 100]
#                                 [--shapes "mamba2-130m mamba-130m mamba2-1.3b"]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/build threads=2 rounds=3 prompt=64 gen=100 shapes="mamba2-130m mamba-130m mamba2-1.3b"
while (($#)); do
  case $1 in
    --build) build=$2 ;; --threads) threads=$2 ;; --rounds) rounds=$2 ;; --prompt) prompt=$2 ;; --gen) gen=$2 ;;
    --shapes) shapes=$2 ;; *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
lock=${CPU_LOCK:-/tmp/cpu-quiet.lock}
ggufs=${GGUF_DIR:-$here/gguf}
out=${OUT:-$here/results.jsonl}
mambacpp=$build/mambacpp
[ -x "$mambacpp" ] || { echo "run.sh: $mambacpp not found (build the mambacpp_cli target, or pass --build)" >&2; exit 1; }
mkdir -p "$ggufs"
[ -d "$here/node_modules/node-llama-cpp" ] || (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
cc -O3 -march=native -fopenmp "$here/read_bw.c" -o "$ggufs/read_bw"
cc -O3 -march=native -fopenmp "$here/fma_peak.c" -o "$ggufs/fma_peak"

# llama.cpp types beside mambacpp weight dtypes (1.3b in f32 is 5 GB: left out, as in the issue's table).
types_for() { case $1 in *1.3b|*1.4b|*2.7b|*2.8b) echo "f16 q8_0" ;; *) echo "f32 f16 q8_0" ;; esac; }
weights_for() { case $1 in *1.3b|*1.4b|*2.7b|*2.8b) echo "bf16" ;; *) echo "f32 bf16 f16" ;; esac; }
for s in $shapes; do
  for t in $(types_for "$s"); do
    [ -s "$ggufs/$s-$t.gguf" ] || node "$here/make_gguf.mjs" --shape "$s" --type "$t" --out "$ggufs/$s-$t.gguf"
  done
done

: > "$out"
for r in $(seq 1 "$rounds"); do
  for s in $shapes; do
    export r s threads prompt gen mambacpp here ggufs
    export llama_types=$(types_for "$s") mamba_weights=$(weights_for "$s")
    flock -x "$lock" bash -c '
      meta() { echo "\"round\": $r, \"shape\": \"$s\", \"threads\": $threads, \"loadavg\": \"$(cut -d" " -f1-3 /proc/loadavg)\""; }
      bw=$(OMP_WAIT_POLICY=PASSIVE "$ggufs/read_bw" "$threads" 1024)
      echo "{$(meta), \"engine\": \"read_bw\", \"result\": $bw}"
      fma=$(OMP_WAIT_POLICY=PASSIVE "$ggufs/fma_peak" "$threads")
      echo "{$(meta), \"engine\": \"fma_peak\", \"result\": $fma}"
      set -- $llama_types
      for w in $mamba_weights; do
        res=$("$mambacpp" bench --shape "$s" --weights "$w" --threads "$threads" -p "$prompt" -g "$gen" -r 1 --json)
        echo "{$(meta), \"engine\": \"mambacpp\", \"dtype\": \"$w\", \"result\": $res}"
        if (($#)); then
          f="$ggufs/$s-$1.gguf"
          res=$(node "$here/bench_llama.mjs" --model "$f" --threads "$threads" --prompt "$prompt" --gen "$gen" --repeat 1)
          echo "{$(meta), \"engine\": \"llama.cpp\", \"dtype\": \"$1\", \"gguf_bytes\": $(stat -c %s "$f"), \"result\": $res}"
          shift
        fi
      done
      for t in "$@"; do
        f="$ggufs/$s-$t.gguf"
        res=$(node "$here/bench_llama.mjs" --model "$f" --threads "$threads" --prompt "$prompt" --gen "$gen" --repeat 1)
        echo "{$(meta), \"engine\": \"llama.cpp\", \"dtype\": \"$t\", \"gguf_bytes\": $(stat -c %s "$f"), \"result\": $res}"
      done
    ' | tee -a "$out"
  done
done
node "$here/summarise.mjs" "$out"
