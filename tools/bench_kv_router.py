#!/usr/bin/env python3
"""Cache-aware routing against round robin: two local replicas, one router.

Starts two `pagellm serve --kv-events` replicas, then for each policy a
tools/kv_router.py in front of them, and sends a few long shared prefixes
(documents), each several times with a different question, interleaved
(doc 0, doc 1, ..., doc 0, doc 1, ...), one request at a time, streaming.
Each policy gets its own documents, so neither finds the other's prefixes.
Reports per policy and round (round r: every document's r-th request), and
over the repeats (rounds 2..): cached prompt tokens
(usage.prompt_tokens_details.cached_tokens) as a share of all prompt tokens,
TTFT p50 and mean. Use an odd number of documents: with an even one, round
robin sends each document back to the same replica by chance.

  tools/bench_kv_router.py --model build/default-model.txt --docs 5 --repeats 4 --doc-words 600 -- --threads 1
Arguments after -- go to both replicas. A --model that ends in .txt names the file it holds.
"""
import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
WORDS = ("the a little big old red green dog cat bird tree house river garden child girl boy mother father friend "
         "walked ran saw found gave took played sang slept looked happy sad quick slow bright dark warm cold "
         "morning evening day night story book song game ball box door window road hill sky sun moon").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url, proc, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    sys.exit(f"{url} did not answer in {timeout} s")


def document(rng, words):
    return "Document. " + " ".join(rng.choice(WORDS) for _ in range(words)) + ".\n"


def ask(base, prompt, max_tokens):
    started = time.perf_counter()
    ttft, usage = None, None
    with requests.post(base + "/v1/completions", stream=True, timeout=600,
                       json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                             "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        routed = r.headers.get("X-Routed-To")
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices"):
                ttft = time.perf_counter() - started
            usage = chunk.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ttft, cached, usage["prompt_tokens"], routed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pagellm", default=str(REPO / "build" / "pagellm"))
    p.add_argument("--model", default=str(REPO / "build" / "default-model.txt"))
    p.add_argument("--docs", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="requests per document")
    p.add_argument("--doc-words", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--output-json")
    p.add_argument("replica_args", nargs="*", help="after --: more arguments for both replicas")
    args = p.parse_args()
    model = Path(args.model)
    if model.suffix == ".txt":
        model = Path(model.read_text().strip())

    procs, results = [], {}
    try:
        urls = []
        for _ in range(2):
            port = free_port()
            proc = subprocess.Popen([args.pagellm, "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
                                     "--kv-events", *args.replica_args],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(proc)
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs):
            wait_healthy(url + "/health", proc)
        for seed, policy in enumerate(("round-robin", "prefix")):
            port = free_port()
            router = subprocess.Popen([sys.executable, str(REPO / "tools" / "kv_router.py"), "--port", str(port),
                                       "--policy", policy, *urls], stderr=subprocess.DEVNULL)
            procs.append(router)
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base + "/router/state", router)
            time.sleep(1)  # the router's first snapshots
            rng = random.Random(seed)
            docs = [document(rng, args.doc_words) for _ in range(args.docs)]
            rows = []
            for rep in range(args.repeats):
                for d, doc in enumerate(docs):
                    question = f"Question {rep}: what did the {rng.choice(WORDS)} do?"
                    ttft, cached, prompt_tokens, routed = ask(base, doc + question, args.max_tokens)
                    rows.append({"doc": d, "repeat": rep, "ttft_s": ttft, "cached": cached,
                                 "prompt_tokens": prompt_tokens, "replica": routed})
                    time.sleep(0.2)  # the router sees the replica's events
            later = [r for r in rows if r["repeat"] > 0]
            results[policy] = {
                "rows": rows,
                "cached_share": sum(r["cached"] for r in later) / sum(r["prompt_tokens"] for r in later),
                "ttft_p50_first_s": statistics.median(r["ttft_s"] for r in rows if r["repeat"] == 0),
                "ttft_p50_repeats_s": statistics.median(r["ttft_s"] for r in later),
                "ttft_mean_repeats_s": statistics.mean(r["ttft_s"] for r in later),
            }
            router.terminate()
            router.wait(10)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)
    print(f"{'policy':<12} {'round':>5} {'cached share':>13} {'TTFT p50':>9} {'TTFT mean':>10}")
    for policy, r in results.items():
        for rep in range(args.repeats):
            rows = [x for x in r["rows"] if x["repeat"] == rep]
            share = sum(x["cached"] for x in rows) / sum(x["prompt_tokens"] for x in rows)
            ttfts = [x["ttft_s"] for x in rows]
            print(f"{policy:<12} {rep + 1:>5} {share:>13.1%} {statistics.median(ttfts):>8.3f}s "
                  f"{statistics.mean(ttfts):>9.3f}s")
        print(f"{policy:<12} {'2..':>5} {r['cached_share']:>13.1%} {r['ttft_p50_repeats_s']:>8.3f}s "
              f"{r['ttft_mean_repeats_s']:>9.3f}s")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
