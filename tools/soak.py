#!/usr/bin/env python3
"""Soak test of `pagellm serve` (issue 9): a mix of valid streaming and
non-streaming requests, invalid bodies, and clients that vanish mid-request in
every way, for a fixed number of requests. At the end the server must answer a
normal request, /metrics must show 0 running, 0 waiting, 0% KV usage and every
KV block free or cached (none leaked), and its RSS must be within a bound of
its level after warm-up.

    tools/soak.py --requests 1000 --duration 180     # `make soak`
    tools/soak.py --requests 1000 --duration 45      # the CI form

Starts its own server on a free loopback port (the model defaults to
stories260K from ../shared/data) and stops it at the end; exits non-zero with
the reason when a check fails."""

import argparse
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    def __init__(self, port):
        self.port = port

    def connect(self, timeout=60):
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    @staticmethod
    def request(path, body, method="POST", extra=()):
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *extra]
        if body is not None:
            head.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")

    def exchange(self, data, timeout=60):
        """Sends `data`, reads until the server closes or the response is whole; -> (status, body)."""
        with self.connect(timeout) as s:
            s.sendall(data)
            return read_response(s)

    def get(self, path):
        return self.exchange(self.request(path, None, "GET", ["Connection: close"]))

    def metrics(self):
        status, body = self.get("/metrics")
        assert status == 200, status
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name.split("{")[0]] = float(value)
        return values


def read_response(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    if status == 100:
        return read_rest_after_continue(s, rest)
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, rest[:n]
    while not rest.endswith(b"0\r\n\r\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, rest


def read_rest_after_continue(s, rest):
    class Replay:
        def __init__(self, first):
            self.first = first

        def recv(self, n):
            if self.first:
                out, self.first = self.first, b""
                return out
            return s.recv(n)

    return read_response(Replay(rest))


def completion(max_tokens, stream, seed):
    return json.dumps({"prompt": random.Random(seed).choice(["Once upon a time", "The little dog", "Lily went"]),
                       "max_tokens": max_tokens, "temperature": 0.8, "seed": seed, "stream": stream}).encode()


INVALID_BODIES = [
    b"{not json",
    b'{"prompt": "x", "max_tokens": 0.5}',
    b'{"prompt": "x", "temperature": "hot"}',
    b'{"prompt": [1, 2, 99999999]}',
    b"[" * 100000,
    b'{"prompt": "x", "n": 1000000}',
    b"\xff\xfe",
    b'{"prompt": "x", "stop_token_ids": [4294967298]}',
]


def structured(i, spec):
    return json.dumps({"prompt": "Once upon a time", "max_tokens": 6, "seed": i, **spec}).encode()


def distinct_schema(tag):
    """A small schema no other request has: a compile and a cache entry each."""
    return {"type": "object", "properties": {f"k{tag}_{j}": {"type": "integer"} for j in range(3)}}


def required_props(n):
    return {"type": "object", "properties": {f"p{j}": {"type": "integer"} for j in range(n)},
            "required": [f"p{j}" for j in range(n)]}


# Structured outputs a hostile client sends: over a limit, an empty language,
# unenforceable keywords, a compile past its time budget. All are 400s.
HOSTILE_SPECS = [
    {"structured_outputs": {"json": '{"type":"array","items":' * 5000 + '{"type":"integer"}' + "}" * 5000}},
    {"guided_json": {"enum": list(range(20000))}},
    {"guided_regex": "(a{1000}){1000}"},
    {"guided_regex": "[^\\s\\S]"},
    {"guided_grammar": 'root ::= root "a"'},
    {"guided_json": {"allOf": [{"type": "string"}, {"type": "integer"}]}},
    {"guided_choice": [f"c{j}" for j in range(10000)]},
    {"guided_json": required_props(400)},  # seconds of compile: stopped at --grammar-compile-timeout
]


def scenario(client, kind, i):
    """Runs one client behaviour; returns a short outcome label."""
    rng = random.Random(i)
    if kind == "plain":
        status, _ = client.exchange(client.request("/v1/completions", completion(rng.randint(4, 48), False, i)))
        return f"plain {status}"
    if kind == "stream":
        status, body = client.exchange(client.request("/v1/completions", completion(rng.randint(4, 48), True, i)))
        return f"stream {status}" + ("" if b"[DONE]" in body else " (no DONE)")
    if kind == "invalid":
        status, _ = client.exchange(client.request("/v1/completions", rng.choice(INVALID_BODIES)))
        return f"invalid {status}"
    if kind == "grammar":
        status, _ = client.exchange(client.request("/v1/completions",
                                                   structured(i, {"guided_json": distinct_schema(i)})))
        return f"grammar {status}"
    if kind == "grammar-hostile":
        status, _ = client.exchange(client.request("/v1/completions", structured(i, rng.choice(HOSTILE_SPECS))))
        return f"grammar-hostile {status}"
    if kind == "chat-invalid":
        body = json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode()
        status, _ = client.exchange(client.request("/v1/chat/completions", body))
        return f"chat-invalid {status}"
    s = client.connect()
    try:
        if kind == "reset-after-send" or kind == "close-after-send":
            s.sendall(client.request("/v1/completions", completion(300, rng.random() < 0.5, i)))
            time.sleep(rng.uniform(0, 0.3))
            if kind == "reset-after-send":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif kind == "close-mid-stream":
            s.sendall(client.request("/v1/completions", completion(300, True, i)))
            s.recv(4096)
        elif kind == "half-close":
            s.sendall(client.request("/v1/completions", completion(16, False, i)))
            s.shutdown(socket.SHUT_WR)
            status, _ = read_response(s)
            return f"half-close {status}"
        elif kind == "partial-body":
            body = completion(16, False, i)
            s.sendall(client.request("/v1/completions", body)[: -len(body) // 2])
        elif kind == "grammar-leave":  # leaves while its grammar compiles
            s.sendall(client.request("/v1/completions", structured(i, {"guided_json": required_props(300 + i % 50)})))
            time.sleep(rng.uniform(0.05, 0.3))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif kind == "partial-head":
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        return kind
    finally:
        s.close()


KINDS = [("plain", 30), ("stream", 30), ("invalid", 10), ("chat-invalid", 3), ("reset-after-send", 6),
         ("close-after-send", 6), ("close-mid-stream", 6), ("half-close", 4), ("partial-body", 3),
         ("partial-head", 2), ("grammar", 6), ("grammar-hostile", 4), ("grammar-leave", 1)]


def schema_rounds(client, pid, rounds, per_round, tolerance):
    """RSS after each round of `per_round` distinct schemas (more than the
    grammar cache holds): flat, or a failure message."""
    sizes = []
    for r in range(rounds):
        for j in range(per_round):
            status, body = client.exchange(client.request("/v1/completions", structured(
                j, {"guided_json": distinct_schema(f"r{r}_{j}")})))
            if status != 200:
                return sizes, f"schema round {r}: {status} {body[:200]!r}"
        wait_idle(client, 10)
        sizes.append(rss(pid))
    print("soak: RSS after each round of " f"{per_round} distinct schemas (MiB): " + ", ".join(str(s >> 20) for s in sizes))
    base = sizes[min(1, len(sizes) - 1)]  # the first round fills the cache
    if sizes and max(sizes[1:] or sizes) > base * (1 + tolerance):
        return sizes, f"RSS grew over the schema rounds: {[s >> 20 for s in sizes]} MiB"
    return sizes, None


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def wait_idle(client, timeout):
    deadline = time.time() + timeout
    m = {}
    while time.time() < deadline:
        m = client.metrics()
        if (m["pagellm:num_requests_running"] == 0 and m["pagellm:num_requests_waiting"] == 0
                and m["pagellm:kv_cache_usage_perc"] == 0):
            return m
        time.sleep(0.1)
    raise AssertionError(f"not idle after {timeout} s: {m}")


def run_batch(client, n, concurrency, offset, outcomes, duration):
    """n requests from `concurrency` clients, started evenly over `duration` seconds."""
    kinds = [k for k, w in KINDS for _ in range(w)]
    rng = random.Random(offset)
    start = time.time()

    def paced(i, kind):
        delay = start + duration * i / n - time.time()
        if delay > 0:
            time.sleep(delay)
        return scenario(client, kind, offset + i)

    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(paced, i, rng.choice(kinds)) for i in range(n)]
        for f in futures:
            try:
                outcomes[f.result()] += 1
            except Exception as e:  # a client-side error is an outcome too, e.g. reset by the server
                outcomes[f"client error {type(e).__name__}"] += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("PAGELLM_BIN", str(REPO / "build" / "pagellm")))
    ap.add_argument("--model", default=str(REPO.parent / "shared" / "data" / "models" / "stories260K.gguf"))
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=float, default=180, help="seconds over which the requests are spread")
    ap.add_argument("--rss-tolerance", type=float, default=0.10, help="allowed RSS growth after warm-up")
    ap.add_argument("--schema-rounds", type=int, default=10,
                    help="rounds of distinct structured-output schemas after the mix (RSS must stay flat)")
    ap.add_argument("--schemas-per-round", type=int, default=100)
    ap.add_argument("--server-arg", action="append", default=[], help="an extra flag for pagellm serve")
    args = ap.parse_args()

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="pagellm-soak-", suffix=".log", delete=False)
    cmd = [args.bin, "serve", args.model, "--port", str(port), "--max-num-seqs", "16", "--http-threads", "32",
           "--header-timeout", "2", "--body-timeout", "2", "--disable-log-requests",
           "--grammar-compile-timeout", "1", *args.server_arg]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    client = Client(port)
    failures = []
    try:
        deadline = time.time() + 60
        while True:
            try:
                if client.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"soak: the server did not start:\n{Path(log.name).read_text()}")
            time.sleep(0.1)

        outcomes = Counter()
        warmup = max(50, args.requests // 5)
        t0 = time.time()
        run_batch(client, warmup, args.concurrency, 0, outcomes, args.duration / 5)
        # The compiled-grammar cache (64 entries) filled, so that its entries
        # count in the warm RSS, as in any server that has run a while.
        for j in range(80):
            client.exchange(client.request("/v1/completions", structured(j, {"guided_json": distinct_schema(f"w{j}")})))
        wait_idle(client, 10)
        rss_warm = rss(proc.pid)
        run_batch(client, args.requests, args.concurrency, warmup, outcomes, args.duration)
        elapsed = time.time() - t0
        m = wait_idle(client, 10)
        rss_end = rss(proc.pid)

        if args.schema_rounds:
            _, problem = schema_rounds(client, proc.pid, args.schema_rounds, args.schemas_per_round,
                                       args.rss_tolerance)
            if problem:
                failures.append(problem)
            m = wait_idle(client, 10)

        status, body = client.exchange(client.request("/v1/completions", completion(8, False, 1)))
        if status != 200 or json.loads(body)["usage"]["completion_tokens"] != 8:
            failures.append(f"a normal request after the soak got {status}: {body[:200]!r}")
        if m["pagellm:kv_blocks_used"] != 0:
            failures.append(f"{m['pagellm:kv_blocks_used']:.0f} KV blocks still in use")
        if m["pagellm:kv_blocks_free"] + m["pagellm:kv_blocks_cached"] != m["pagellm:kv_blocks_total"]:
            failures.append(f"KV blocks leaked: free {m['pagellm:kv_blocks_free']:.0f} + cached "
                            f"{m['pagellm:kv_blocks_cached']:.0f} != total {m['pagellm:kv_blocks_total']:.0f}")
        growth = (rss_end - rss_warm) / rss_warm
        # On a small model the whole server is ~30 MiB: a few MiB of heap that
        # the large hostile bodies touched are not a trend, so 8 MiB is free.
        if growth > args.rss_tolerance and rss_end - rss_warm > (8 << 20):
            failures.append(f"RSS grew {growth:.1%} after warm-up ({rss_warm >> 20} -> {rss_end >> 20} MiB)")
        bad = {k: v for k, v in outcomes.items() if k.split()[-1].startswith("5") or "error" in k or "no DONE" in k}
        if bad:
            failures.append(f"unexpected outcomes: {bad}")
        if proc.poll() is not None:
            failures.append(f"the server exited with {proc.returncode}")

        print(f"soak: {warmup} warm-up + {args.requests} requests in {elapsed:.1f} s at concurrency "
              f"{args.concurrency}; RSS {rss_warm >> 20} -> {rss_end >> 20} MiB ({growth:+.1%})")
        for k, v in sorted(outcomes.items()):
            print(f"  {v:5d}  {k}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "killed"
        if code != 0:
            failures.append(f"the server's exit code at SIGTERM was {code}")
    if failures:
        print("soak: FAILED\n  " + "\n  ".join(failures) + f"\n  server log: {log.name}", file=sys.stderr)
        return 1
    print("soak: passed (0 running, 0 waiting, 0% KV, no leaked block, RSS within bound)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
