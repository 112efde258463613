#!/usr/bin/env bash
# One recorded fuzz run (a benchmark, not CI; docs/reliability.md): build-fuzz/fuzz/<target>_fuzz from the committed
# seeds and regression inputs, into a scratch corpus under $FUZZ_WORK (default /tmp/mambacpp-fuzz), until `runs`
# executions or `seconds` have passed. Prints libFuzzer's final stats; the log is $FUZZ_WORK/<target>.log.
#   scripts/run_fuzz.sh <target> <seconds> <max_len> [runs=10000000]
set -euo pipefail
cd "$(dirname "$0")/.."
target=$1 seconds=$2 max_len=$3 runs=${4:-10000000}
work=${FUZZ_WORK:-/tmp/mambacpp-fuzz}
mkdir -p "$work/$target"
seeds=(fuzz/corpus/"$target")
[ -d fuzz/regressions/"$target" ] && seeds+=(fuzz/regressions/"$target")
start=$(date +%s)
set +e
build-fuzz/fuzz/"$target"_fuzz -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 -runs="$runs" \
  -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$work/$target-" \
  "$work/$target" "${seeds[@]}" >"$work/$target.log" 2>&1
rc=$?
set -e
echo "$target: exit $rc after $(( $(date +%s) - start )) s"
grep -E "^#[0-9]+.*(DONE|INITED)|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb|ERROR|SUMMARY" \
  "$work/$target.log" | tail -n 8
exit $rc
