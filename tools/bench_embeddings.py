#!/usr/bin/env python3
"""Embedding throughput, pagellm against llama.cpp's llama-server, one GGUF.

Each engine serves the file in turn (order alternating per repetition) and
gets the same requests on /v1/embeddings: BATCH inputs of INPUT_LEN token ids
each (ids, so both embed exactly the same tokens whatever their tokenizers),
last-token pooling, normalised. One warm-up request, then REQUESTS timed ones
back to back; inputs per second is BATCH * REQUESTS over their time. Ratios
are taken per repetition; the medians are printed and written as JSON.

  tools/bench_embeddings.py --pagellm build/pagellm --llama-server /work/peers/llama-build/bin/llama-server \\
      --model qwen3-embedding-0.6b-q8_0.gguf --threads 2 --reps 3 --output-json docs/bench/embeddings.json

Make the file with `pagellm make-dummy --shape qwen3-embedding-0.6b --type q8_0 -o FILE`.
"""
import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import time

import requests


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, port, log):
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} did not become healthy")


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_engine(name, cmd, port, batches, log):
    proc = start(cmd, port, log)
    try:
        url = f"http://127.0.0.1:{port}/v1/embeddings"

        def embed(batch):
            r = requests.post(url, json={"input": batch, "model": "m"}, timeout=600)
            r.raise_for_status()
            data = r.json()["data"]
            assert len(data) == len(batch), f"{name}: {len(data)} embeddings for {len(batch)} inputs"
            return data

        embed(batches[0])  # warm-up
        t0 = time.perf_counter()
        for b in batches[1:]:
            embed(b)
        seconds = time.perf_counter() - t0
        return sum(len(b) for b in batches[1:]) / seconds
    finally:
        stop(proc)


def load_average():
    return os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4, help="timed requests per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=150000, help="token ids are drawn below this")
    ap.add_argument("--output-json")
    args = ap.parse_args()

    rng = random.Random(1)
    batches = [[[rng.randrange(100, args.vocab) for _ in range(args.input_len)] for _ in range(args.batch)]
               for _ in range(args.requests + 1)]
    tokens = args.batch * args.input_len
    slots = args.batch
    engines = {
        "pagellm": lambda port: [args.pagellm, "serve", args.model, "--task", "embed", "--host", "127.0.0.1",
                                 "--port", str(port), "--threads", str(args.threads), "--max-num-seqs", str(slots),
                                 "--max-num-batched-tokens", str(tokens), "--max-model-len", str(4 * args.input_len),
                                 "--pooling", "last", "--normalize", "--served-model-name", "m"],
        # Its fastest setting found here for this load: one slot, 512-token batches (one slot per input with
        # one 4096-token batch: 1.31-1.39 inputs/s; 4 slots, 512: 1.54; 1 slot, 512: 1.58).
        "llama.cpp": lambda port: [args.llama_server, "-m", args.model, "--embedding", "--pooling", "last",
                                   "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
                                   "-tb", str(args.threads), "-np", "1", "-c", str(4 * args.input_len),
                                   "-b", "512", "-ub", "512", "--no-webui"],
    }
    runs = []
    log = open("/tmp/bench_embeddings.log", "w")
    for rep in range(args.reps):
        order = list(engines) if rep % 2 == 0 else list(reversed(engines))
        rates = {}
        for name in order:
            port = free_port()
            rates[name] = run_engine(name, engines[name](port), port, batches, log)
            print(f"rep {rep}: {name} {rates[name]:.2f} inputs/s (load {load_average():.2f})", flush=True)
        runs.append({"rates": rates, "ratio": rates["pagellm"] / rates["llama.cpp"], "load": load_average()})
    med = {n: statistics.median(r["rates"][n] for r in runs) for n in engines}
    ratios = [r["ratio"] for r in runs]
    print(f"median inputs/s: pagellm {med['pagellm']:.2f}, llama.cpp {med['llama.cpp']:.2f}; "
          f"ratio median {statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"model": os.path.basename(args.model), "threads": args.threads, "input_len": args.input_len,
                       "batch": args.batch, "requests": args.requests, "runs": runs, "median_rates": med,
                       "median_ratio": statistics.median(ratios)}, f, indent=1)


if __name__ == "__main__":
    main()
