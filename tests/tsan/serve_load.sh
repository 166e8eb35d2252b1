#!/usr/bin/env bash
# The whole server under ThreadSanitizer: `pagellm serve` (a dummy model, so
# no download) takes concurrent streaming load from `pagellm bench serve`,
# while a second client gives up mid-stream (disconnects abort requests), and
# then shuts down on SIGTERM. Any TSan report ends the server with an error
# (halt_on_error=1) and fails this script. The unit tests cover the pieces;
# this covers them wired together: HTTP threads, handlers, the engine loop.
#   tests/tsan/serve_load.sh BUILD_DIR      (BUILD_DIR/pagellm built with PAGELLM_TSAN)
set -uo pipefail
bin=${1:?usage: tests/tsan/serve_load.sh BUILD_DIR}/pagellm
log=$(mktemp /tmp/pagellm-tsan-serve.XXXXXX)

"$bin" serve --load-format dummy --dummy-shape tiny-llama --port 0 --threads 2 --http-threads 16 \
  --disable-log-requests >"$log" 2>&1 &
server=$!
url=
for _ in $(seq 600); do  # TSan start-up is slow: up to 60 s
  url=$(grep -oE 'http://127\.0\.0\.1:[0-9]+' "$log" | head -1)
  [ -n "$url" ] || ! kill -0 "$server" 2>/dev/null && break
  sleep 0.1
done
if [ -z "$url" ]; then
  echo "tsan-serve: the server did not start:"; cat "$log"
  kill "$server" 2>/dev/null
  exit 1
fi

status=0
# Steady load, and a client whose timeout cuts its streams off halfway.
"$bin" bench serve --base-url "$url" --num-prompts 48 --max-concurrency 12 --input-len 32 --output-len 32 \
  --timeout 600 --output-json /dev/null >"$log.load" 2>&1 &
load=$!
"$bin" bench serve --base-url "$url" --num-prompts 16 --max-concurrency 16 --input-len 16 --output-len 400 \
  --timeout 8 --output-json /dev/null >"$log.cut" 2>&1
wait "$load" || { echo "tsan-serve: the load client failed:"; cat "$log.load"; status=1; }

kill -TERM "$server"
wait "$server"
rc=$?
if ((rc != 0)) || grep -q "ThreadSanitizer" "$log"; then
  echo "tsan-serve: the server exited with $rc:"
  cat "$log"
  status=1
else
  echo "tsan-serve: ok ($(grep -c . "$log") server log lines, no reports)"
fi
[ "${KEEP_LOGS:-0}" = 1 ] || rm -f "$log" "$log.load" "$log.cut"
exit $status
