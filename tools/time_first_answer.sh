#!/usr/bin/env bash
# Time from `git clone` to the first answer of `make serve`, as a new user
# sees it, then once more from the warm tree (built, set up).
#   tools/time_first_answer.sh [SOURCE_REPO] [CLONE_DIR] [PORT]
# SOURCE_REPO defaults to this checkout; CLONE_DIR to a new temporary folder.
# On a fresh machine the first run includes the Debian packages, the Python
# virtual environment, xgrammar's build and the model package.
set -euo pipefail
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
dir=${2:-$(mktemp -d /tmp/pagellm-first-answer.XXXXXX)/pagellm}
port=${3:-8765}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Starts `make serve` in its own process group; prints seconds to /health 200
# and to the first chat answer.
serve_and_ask() {
  local label=$1 t0 t_health t_answer pid answer
  t0=$(now)
  setsid make -C "$dir" serve PORT="$port" >"$dir/../serve-$label.log" 2>&1 &
  pid=$!
  trap 'kill -- -'"$pid"' 2>/dev/null || true' EXIT
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "make serve exited; see $dir/../serve-$label.log" >&2; exit 1; }
    sleep 0.5
  done
  t_health=$(now)
  answer=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"Name a color."}],"max_tokens":16,"temperature":0}')
  t_answer=$(now)
  kill -- -"$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  trap - EXIT
  echo "$label: /health after $(elapsed "$t0" "$t_health") s, first answer after $(elapsed "$t0" "$t_answer") s"
  echo "  answer: $(printf '%s' "$answer" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"].strip()[:60])')"
}

t_clone=$(now)
git clone -q "$src" "$dir"
echo "clone: $(elapsed "$t_clone" "$(now)") s into $dir"
serve_and_ask fresh
serve_and_ask warm
