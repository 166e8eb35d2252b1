#!/usr/bin/env bash
# Runs a GoogleTest binary as N shards in parallel (GTEST_TOTAL_SHARDS), each
# one process for its share of the tests. Sanitizer builds use it instead of
# ctest: ctest starts one process per test, and an ASan process takes ~0.35 s
# to start, which over 1,700 tests was half of the job's time.
#   tools/gtest_shards.sh N BINARY [GTEST_FILTER]     (SHARD_TIMEOUT: seconds per shard, 1800)
# Exit status: non-zero when any shard failed; its log's end is printed.
set -uo pipefail
n=$1 bin=$2 filter=${3:-*}
logs=$(mktemp -d)
pids=()
for ((i = 0; i < n; i++)); do
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout "${SHARD_TIMEOUT:-1800}" "$bin" --gtest_filter="$filter" \
    > "$logs/shard$i.log" 2>&1 &
  pids+=($!)
done
status=0
for ((i = 0; i < n; i++)); do
  if wait "${pids[$i]}"; then
    echo "shard $i of $n: $(grep -E '^\[  PASSED  \]' "$logs/shard$i.log")"
  else
    status=1
    echo "shard $i of $n FAILED; the end of its log:"
    grep -E '^\[  FAILED  \]' "$logs/shard$i.log" | head -50
    tail -n 80 "$logs/shard$i.log"
  fi
done
rm -rf "$logs"
exit $status
