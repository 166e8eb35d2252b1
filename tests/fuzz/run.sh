#!/usr/bin/env bash
# Runs the libFuzzer targets built in BUILD_DIR, each for SECONDS, on a copy
# of its seed corpus (the committed tests/fuzz/corpus is never written).
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]     (default: every target)
# FUZZ_JOBS=N runs N targets at once (each is one process on one core).
# FUZZ_KEEP_GOING=1 goes on after a finding (libFuzzer's fork mode), to
# collect several in one run; the default stops at the first, as CI wants.
# Exits 1 when any target found something, and prints where the input is and
# how to replay it; the log of each run is in BUILD_DIR/fuzz/logs.
set -uo pipefail
cd "$(dirname "$0")/../.."

build=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]}
seconds=${2:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
targets=("$@")
((${#targets[@]})) || targets=(gguf safetensors tokenizer_json request chat_template http_request grammar)
jobs=${FUZZ_JOBS:-1}
extra=()
[ "${FUZZ_KEEP_GOING:-0}" = 1 ] && extra=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)

dict_of() {
  case $1 in
    gguf) echo tests/fuzz/dict/gguf.dict ;;
    chat_template) echo tests/fuzz/dict/jinja.dict ;;
    http_request) echo tests/fuzz/dict/http.dict ;;
    *) echo tests/fuzz/dict/json.dict ;;
  esac
}

# Leaks count as findings; UB stops the run (the build has -fno-sanitize-recover too).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

work=$build/fuzz
mkdir -p "$work/logs"

run_one() {
  local t=$1 bin=$build/${1}_fuzzer
  local corpus=$work/corpus/$t findings=$work/findings/$t log=$work/logs/$t.log
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is missing (build it: make fuzz-build)" >"$log"
    return 2
  fi
  mkdir -p "$corpus" "$findings"
  # Seeds join whatever earlier runs found; -n keeps files already there.
  cp -n tests/fuzz/corpus/"$t"/* "$corpus"/
  touch "$work/logs/$t.start"  # findings newer than this are this run's
  "$bin" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="$(dict_of "$t")" -artifact_prefix="$findings/" "${extra[@]}" >"$log" 2>&1
}

# Each run leaves its exit status in a file: simpler than tracking pids through wait -n.
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
  echo "fuzz: $t for ${seconds}s"
  (run_one "$t"; echo $? >"$work/logs/$t.rc") &
done
wait
failed=0
for t in "${targets[@]}"; do
  log=$work/logs/$t.log
  rc=$(cat "$work/logs/$t.rc")
  stats=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
  new=$(find "$work/findings/$t" -type f -newer "$work/logs/$t.start" 2>/dev/null | sort)
  # Fork mode (FUZZ_KEEP_GOING) exits 0 after ignored crashes: the files tell.
  if ((rc == 0)) && [ -z "$new" ]; then
    echo "fuzz: $t: ok (${stats:-?} inputs)"
    continue
  fi
  failed=1
  echo "fuzz: $t: FINDING (exit $rc); log $log"
  # The report: the sanitizer's verdict and the first frames of our code
  # (libFuzzer, sanitizer and libc frames skipped).
  grep -E 'ERROR: |SUMMARY: |runtime error|invariant broken|deadly signal|timeout after|out-of-memory' "$log" |
    sort -u | head -8 | sed 's/^/    /'
  grep -E '^ +#[0-9]+ ' "$log" | grep -vE 'fuzzer::|__sanitizer|libc\.so|nptl/|stdlib/|assert/|signal/|libstdc\+\+| /usr/include/| /usr/lib/gcc' |
    head -8 | sed 's/^/    /'
  for f in $new; do
    echo "    input: $f"
    echo "    replay: $build/${t}_fuzzer $f"
    echo "    keep it: cp $f tests/fuzz/regressions/$t/"
  done
done
exit $failed
