#!/usr/bin/env bash
# mambacpp beside llama.cpp on the same GGUF files (CPU): per round and file, this machine's read bandwidth, then
# `mambacpp bench --model F` and llama.cpp's bench_llama.mjs on F, back to back under the machine's benchmark lock
# (flock -x $CPU_LOCK), niced (NICE= runs them at normal priority: on a machine loaded by others' builds a niced run
# gets almost no CPU), with the load average. One JSON line per run on stdout; summarise with
# dev/cpu_quant_summary.py. CPU machine; needs scripts/llamacpp_bench's npm packages (npm ci there) and read_bw.
#   dev/cpu_quant_bench.sh BUILD_DIR ROUNDS PROMPT GEN FILE.gguf... > results.jsonl
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$1 rounds=$2 prompt=$3 gen=$4
shift 4
bench=$root/scripts/llamacpp_bench
lock=${CPU_LOCK:-/tmp/cpu-quiet.lock}
threads=${THREADS:-2}
nice_cmd=${NICE-nice}
read_bw=$build/read_bw
[ -x "$read_bw" ] || cc -O3 -march=native -fopenmp "$bench/read_bw.c" -o "$read_bw"
for r in $(seq 1 "$rounds"); do
  for f in "$@"; do
    export r f threads prompt gen build bench read_bw
    flock -x "$lock" $nice_cmd bash -c '
      meta() { echo "\"round\": $r, \"file\": \"$(basename "$f")\", \"threads\": $threads, \"loadavg\": \"$(cut -d" " -f1-3 /proc/loadavg)\""; }
      echo "{$(meta), \"engine\": \"read_bw\", \"result\": $(OMP_WAIT_POLICY=PASSIVE "$read_bw" "$threads" 1024)}"
      res=$("$build/mambacpp" bench --model "$f" --device cpu --threads "$threads" -p "$prompt" -g "$gen" -r 1 --json)
      echo "{$(meta), \"engine\": \"mambacpp\", \"result\": $res}"
      res=$(node "$bench/bench_llama.mjs" --model "$f" --threads "$threads" --prompt "$prompt" --gen "$gen" --repeat 1)
      echo "{$(meta), \"engine\": \"llama.cpp\", \"result\": $res}"
    '
  done
done
