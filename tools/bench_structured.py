#!/usr/bin/env python3
"""Structured outputs' cost, measured side by side on one server:
  1. time per output token at --max-concurrency 8, the same requests free and
     constrained by a JSON schema (runs alternate; medians of the repeats);
  2. the first-request latency of a schema never seen (compile) against the
     same request once the schema is cached.
Writes one JSON record (docs/bench/structured_outputs_gemma3_270m.json).

  .venv/bin/python tools/bench_structured.py --model "$(cat build/default-model.txt)" \
      --output docs/bench/structured_outputs_gemma3_270m.json
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
# Long enough that every request runs to max_tokens (same output length free
# and constrained): a list of at least 40 short strings.
SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 40}},
    "required": ["items"]}


def bench_serve(binary, base, args, extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [binary, "bench", "serve", "--base-url", base, "--num-prompts", str(args.num_prompts),
               "--max-concurrency", str(args.concurrency), "--input-len", str(args.input_len),
               "--output-len", str(args.output_len), "--prompt-format", "text", "--output-json", out.name]
        if extra:
            cmd += ["--extra-body", json.dumps(extra)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out.name))["results"]["metrics"]


def compile_latency(base, model, fresh):
    schema = {"type": "object", "properties": {f"field_{fresh}_{i}": {"type": "integer"} for i in range(6)}}
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0, "guided_json": schema}
    times = []
    for _ in range(2):  # first: compile; second: the cache
        t = time.perf_counter()
        r = requests.post(base + "/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        times.append(time.perf_counter() - t)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--binary", default=str(REPO / "build" / "pagellm"))
    ap.add_argument("--port", type=int, default=8211)
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen([args.binary, "serve", args.model, "--port", str(args.port), "--max-num-seqs",
                               str(args.concurrency), "--disable-log-requests"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if requests.get(base + "/health", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        model = requests.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
        first_ever = compile_latency(base, model, "warm")  # includes the one-time vocabulary scan
        compiles = [compile_latency(base, model, f"s{k}") for k in range(5)]
        free, constrained = [], []
        bench_serve(args.binary, base, args, None)  # warm-up
        for _ in range(args.repeats):
            free.append(bench_serve(args.binary, base, args, None))
            constrained.append(bench_serve(args.binary, base, args, {"guided_json": SCHEMA}))
        metrics = requests.get(base + "/metrics", timeout=10).text
    finally:
        server.terminate()
        server.wait(60)

    def med(runs, key):
        return statistics.median(r[key]["median"] for r in runs)

    record = {
        "command": " ".join(sys.argv),
        "model": args.model,
        "concurrency": args.concurrency, "num_prompts": args.num_prompts,
        "input_len": args.input_len, "output_len": args.output_len, "repeats": args.repeats,
        "schema": SCHEMA,
        "tpot_ms_free": med(free, "tpot_ms"), "tpot_ms_constrained": med(constrained, "tpot_ms"),
        "ttft_ms_free": med(free, "ttft_ms"), "ttft_ms_constrained": med(constrained, "ttft_ms"),
        "output_tokens_free": [r["total_output_tokens"] for r in free],
        "output_tokens_constrained": [r["total_output_tokens"] for r in constrained],
        "first_schema_ever_s": first_ever[0],
        "new_schema_s": statistics.median(c[0] for c in compiles),
        "cached_schema_s": statistics.median(c[1] for c in compiles),
        "structured_metrics": [l for l in metrics.splitlines() if l.startswith("pagellm:structured_output")],
        "free_runs": free, "constrained_runs": constrained,
    }
    record["tpot_ratio"] = record["tpot_ms_constrained"] / record["tpot_ms_free"]
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if not k.endswith("_runs")}, indent=1))


if __name__ == "__main__":
    main()
