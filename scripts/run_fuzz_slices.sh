#!/usr/bin/env bash
# A long fuzz run on a shared machine (a benchmark, not CI; docs/reliability.md): build-fuzz/fuzz/<target>_fuzz in
# slices of at most `slice` seconds at idle CPU priority, each waiting while a benchmark holds /tmp/bench-active.*
# (and stopped early when one takes it), until `runs` executions in all or the `until` time (date -d syntax, e.g.
# 16:00) has come. libFuzzer keeps its corpus in $FUZZ_WORK/<target> between slices; the executions of the slices
# are summed.
#   scripts/run_fuzz_slices.sh <target> <max_len> [runs=10000000] [until=+1hour] [slice=290]
# Appends one line per slice to $FUZZ_WORK/<target>.slices (executions, seconds, cov, ft, corpus, peak RSS) and
# prints the totals at the end. Exits non-zero at the first finding (its input is $FUZZ_WORK/<target>-crash-*).
set -uo pipefail
cd "$(dirname "$0")/.."
target=$1 max_len=$2 runs=${3:-10000000} until=$(date -d "${4:-+1hour}" +%s) slice=${5:-290}
work=${FUZZ_WORK:-/tmp/mambacpp-fuzz}
mkdir -p "$work/$target"
seeds=(fuzz/corpus/"$target")
[ -d fuzz/regressions/"$target" ] && seeds+=(fuzz/regressions/"$target")
log=$work/$target.slices
done_runs=0 done_s=0
while (( done_runs < runs )) && (( $(date +%s) + 30 < until )); do
  while ls /tmp/bench-active.* >/dev/null 2>&1; do sleep 5; done
  left=$(( until - $(date +%s) )); (( left < slice )) && slice=$left
  start=$(date +%s)
  chrt --idle 0 nice -n 19 timeout $(( slice + 10 )) build-fuzz/fuzz/"$target"_fuzz -max_len="$max_len" -timeout=25 \
    -rss_limit_mb=2048 -runs=$(( runs - done_runs )) -max_total_time="$slice" -print_final_stats=1 \
    -artifact_prefix="$work/$target-" "$work/$target" "${seeds[@]}" >"$work/$target.last.log" 2>&1 &
  pid=$!
  # A benchmark that starts mid-slice stops the slice at once (SIGINT: libFuzzer prints its stats and exits 72;
  # timeout passes the signal on): even at idle priority a fuzzer costs a 2-thread decode up to two thirds of its
  # memory bandwidth.
  while kill -0 "$pid" 2>/dev/null; do
    if ls /tmp/bench-active.* >/dev/null 2>&1; then kill -INT "$pid" 2>/dev/null; fi
    sleep 1
  done
  wait "$pid"
  rc=$?
  (( rc == 72 )) && grep -q 'libFuzzer: run interrupted' "$work/$target.last.log" && rc=0
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$target.last.log" | tail -n 1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$work/$target.last.log" | tail -n 1)
  inited=$(grep -m1 -E '^#[0-9]+[[:space:]]+INITED' "$work/$target.last.log" | grep -oE 'cov: [0-9]+' | cut -d' ' -f2)
  final=$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$work/$target.last.log" | tail -n 1)
  cov=$(grep -oE 'cov: [0-9]+' <<<"$final" | cut -d' ' -f2) ft=$(grep -oE 'ft: [0-9]+' <<<"$final" | cut -d' ' -f2)
  corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' <<<"$final" | cut -d' ' -f2)
  echo "$(date -u +%H:%M:%S) rc=$rc execs=${execs:-0} secs=$secs cov_start=${inited:-?} cov=${cov:-?} ft=${ft:-?}" \
       "corpus=${corp:-?} peak_rss_mb=${rss:-?} load=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
  done_runs=$(( done_runs + ${execs:-0} )) done_s=$(( done_s + secs ))
  if (( rc != 0 )) && grep -qE 'ERROR: libFuzzer|SUMMARY: (Address|Undefined|Leak)|runtime error' "$work/$target.last.log"; then
    cp "$work/$target.last.log" "$work/$target.finding.$(date +%s).log"
    echo "$target: finding after $done_runs executions; see $work/$target.last.log" >&2
    exit 1
  fi
done
echo "$target: $done_runs executions in $done_s s (slices in $log)"
