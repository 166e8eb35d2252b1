#!/usr/bin/env bash
# The aarch64 build's tests under qemu-user (make arm-test), once per CPU model:
#   max          every level (neon, neon-dotprod, neon-i8mm): the kernel and op
#                tests at each level, stories260K greedy, and a server answering
#                one completion
#   neoverse-n1  dotprod without i8mm, and cortex-a57 plain NEON: the level
#                detected and named, the kernels of that level, stories260K greedy
# Emulated: says nothing about speed.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARM_DIR=$(realpath "${ARM_DIR:-build-arm}")
BIN=$ARM_DIR/build
STORIES=$(realpath -m ../shared/data/models/stories260K.gguf)
qemu() { local cpu=$1; shift; qemu-aarch64-static -L "$ARM_DIR/sysroot" -cpu "$cpu" "$@"; }

check_level() {  # cpu, the level `pagellm info` must name
  local out
  out=$(qemu "$1" "$BIN/pagellm" info --devices)
  echo "$out" | sed "s/^/arm [$1] /"
  grep -q "^kernels: $2 kernels" <<< "$out" || { echo "arm [$1]: expected $2 kernels" >&2; return 1; }
}

kernel_tests() {  # cpu, gtest filter
  echo "arm [$1]: pagellm_kernel_tests --gtest_filter=$2"
  (cd "$BIN" && qemu "$1" ./pagellm_kernel_tests --gtest_brief=1 "--gtest_filter=$2")
}

server_test() {  # cpu
  local port log pid rc=0
  if [ ! -f "$STORIES" ]; then
    echo "arm: skipping the server test: no $STORIES" >&2
    return 0
  fi
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  log=$ARM_DIR/serve-$1.log
  qemu "$1" "$BIN/pagellm" serve --model "$STORIES" --host 127.0.0.1 --port "$port" > "$log" 2>&1 &
  pid=$!
  python3 - "$port" << 'PY' || rc=$?
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(240):  # up to 2 minutes for start-up under emulation
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
        break
    except OSError:
        time.sleep(0.5)
body = json.dumps({"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}).encode()
req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
c = json.load(urllib.request.urlopen(req, timeout=120))
text = c["choices"][0]["text"]
print(f"arm: completion {text!r}")
# stories260K's greedy continuation (tests/fixtures/models/stories260K-greedy.json, tests/e2e/test_completions.py)
want = ", there was a little girl named Lily. She loved to play outside in the park."
assert want.startswith(text) and len(text) > 20, text
assert c["usage"]["completion_tokens"] == 20 and c["choices"][0]["finish_reason"] == "length", c
PY
  kill -TERM "$pid" 2> /dev/null || true
  wait "$pid" || true
  if ((rc)); then
    echo "arm [$1]: server test failed; its log:" >&2
    cat "$log" >&2
  fi
  return $rc
}

ALL='QuantsNeon.*:QuantsFast.*:QuantsIsa.*:Quants/*:*MatmulTypes*:*BackendOps*:*Stories260KGreedy*:-*cpu_avx*:*opencl'
SHORT='QuantsNeon.*:QuantsFast.*:QuantsIsa.*:*Stories260KGreedy*'
check_level max neon-i8mm
kernel_tests max "$ALL"
server_test max
check_level neoverse-n1 neon-dotprod
kernel_tests neoverse-n1 "$SHORT:*BackendOps*/cpu_neon_dotprod"
check_level cortex-a57 neon
kernel_tests cortex-a57 "$SHORT:*BackendOps*/cpu_neon"
echo "arm: all passed"
