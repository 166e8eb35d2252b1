#!/usr/bin/env python3
"""Scheduling controls side by side in one run (docs/performance.md section 11).

1. Admission (--preemption-policy): `pagellm bench throughput` on an
   over-subscribed workload (more sequences than the KV cache holds at full
   length), aggressive and conservative alternating --reps times: output
   tokens/s and preemptions per run.
2. Presets (--scheduling-preset): for each preset (and none), a `pagellm
   serve` is started and `pagellm bench serve` sends a stream of long prompts
   at a fixed rate: TTFT, ITL and output throughput.
3. Step composition (--step-composition): for fcfs and length-aware, a
   `pagellm serve` with a small step budget takes two streams at once, short
   prompts and long ones (two `pagellm bench serve` clients): each stream's
   TTFT and ITL.

  tools/bench_scheduling.py --model "$(cat build/default-model.txt)" --reps 3 \\
      --output docs/bench/scheduling_gemma3_270m.json
"""
import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr}")
    return p


def admission(args):
    out = {}
    cmd_base = [args.pagellm, "bench", "throughput", "-m", args.model, "--num-prompts", str(args.prompts),
                "--input-len", str(args.input_len), "--output-len", str(args.output_len),
                "--max-num-seqs", str(args.prompts), "--kv-cache-memory", args.kv_cache_memory,
                "-t", str(args.threads), "--num-iters", "1"]
    for rep in range(args.reps):
        for policy in ("aggressive", "conservative"):
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                cmd = cmd_base + ["--preemption-policy", policy, "--output-json", f.name]
                run(cmd)
                it = json.loads(Path(f.name).read_text())["results"]["iterations"][0]
            row = out.setdefault(policy, {"output_tokens_per_s": [], "preemptions": [], "elapsed_s": [],
                                          "command": " ".join(cmd[:-2])})
            row["output_tokens_per_s"].append(it["output_tokens"] / it["end_s"])
            row["preemptions"].append(it["preemptions"])
            row["elapsed_s"].append(it["end_s"])
            print(f"admission {policy} rep {rep + 1}: {row['output_tokens_per_s'][-1]:.1f} output tokens/s, "
                  f"{it['preemptions']} preemptions", file=sys.stderr)
    return {p: {k: (summary(v) if isinstance(v, list) else v) for k, v in r.items()} for p, r in out.items()}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def presets(args):
    out = {}
    for preset in ("none", "latency", "balanced", "throughput"):
        server, port, cmd = start_server(args, [] if preset == "none" else ["--scheduling-preset", preset])
        try:
            runs = []
            for rep in range(args.reps):
                with tempfile.NamedTemporaryFile(suffix=".json") as f:
                    bench = [args.pagellm, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
                             "--num-prompts", str(args.serve_prompts), "--max-concurrency", "16",
                             "--request-rate", str(args.request_rate), "--input-len", str(args.serve_input_len),
                             "--output-len", str(args.serve_output_len), "--seed", str(rep),
                             "--output-json", f.name]
                    run(bench)
                    runs.append(json.loads(Path(f.name).read_text()))
        finally:
            server.terminate()
            server.wait(60)

        def metric(path):
            vals = []
            for r in runs:
                v = r["results"]["metrics"]
                for k in path:
                    v = v[k]
                vals.append(v)
            return summary(vals)

        out[preset] = {"ttft_ms_median": metric(["ttft_ms", "median"]), "ttft_ms_p99": metric(["ttft_ms", "p99"]),
                       "itl_ms_median": metric(["itl_ms", "median"]), "itl_ms_p99": metric(["itl_ms", "p99"]),
                       "output_tokens_per_s": metric(["output_throughput"]), "server": " ".join(cmd),
                       "bench": " ".join(bench[:-2])}
        o = out[preset]
        print(f"preset {preset}: TTFT {o['ttft_ms_median']['median']:.0f} ms (p99 {o['ttft_ms_p99']['median']:.0f}), "
              f"ITL {o['itl_ms_median']['median']:.1f} ms (p99 {o['itl_ms_p99']['median']:.1f}), "
              f"{o['output_tokens_per_s']['median']:.1f} output tokens/s", file=sys.stderr)
    return out


def start_server(args, extra):
    port = free_port()
    cmd = [args.pagellm, "serve", "--model", args.model, "--port", str(port), "-t", str(args.threads),
           "--max-model-len", "2048", *extra]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return server, port, cmd


def composition(args):
    """Short and long prompts at once: does a long prompt's prefill hold up short ones?"""
    streams = {"short": (args.short_input_len, args.short_rate, args.short_prompts),
               "long": (args.long_input_len, args.long_rate, args.long_prompts)}
    out = {}
    for rep in range(args.reps):
        for comp in ("fcfs", "length-aware"):
            server, port, cmd = start_server(args, ["--step-composition", comp, "--max-num-batched-tokens",
                                                    str(args.composition_budget)])
            try:
                procs = {}
                files = {}
                for name, (input_len, rate, n) in streams.items():
                    files[name] = tempfile.NamedTemporaryFile(suffix=".json")
                    bench = [args.pagellm, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
                             "--num-prompts", str(n), "--request-rate", str(rate), "--input-len", str(input_len),
                             "--output-len", str(args.composition_output_len), "--seed", str(rep),
                             "--output-json", files[name].name]
                    procs[name] = subprocess.Popen(bench, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for name, p in procs.items():
                    if p.wait() != 0:
                        sys.exit(f"bench serve ({name}) failed: {p.stderr.read()}")
            finally:
                server.terminate()
                server.wait(60)
            row = out.setdefault(comp, {"server": " ".join(cmd)})
            for name in streams:
                m = json.loads(Path(files[name].name).read_text())["results"]["metrics"]
                files[name].close()
                r = row.setdefault(name, {"ttft_ms_median": [], "ttft_ms_p99": [], "itl_ms_median": [],
                                          "itl_ms_p99": [], "output_tokens_per_s": []})
                r["ttft_ms_median"].append(m["ttft_ms"]["median"])
                r["ttft_ms_p99"].append(m["ttft_ms"]["p99"])
                r["itl_ms_median"].append(m["itl_ms"]["median"])
                r["itl_ms_p99"].append(m["itl_ms"]["p99"])
                r["output_tokens_per_s"].append(m["output_throughput"])
                print(f"composition {comp} rep {rep + 1} {name}: TTFT {m['ttft_ms']['median']:.0f} ms "
                      f"(p99 {m['ttft_ms']['p99']:.0f}), ITL p99 {m['itl_ms']['p99']:.1f} ms", file=sys.stderr)
    return {c: {k: ({m: summary(v) for m, v in r.items()} if isinstance(r, dict) else r) for k, r in row.items()}
            for c, row in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", default=str(REPO / "build" / "pagellm"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=192)
    ap.add_argument("--kv-cache-memory", default="48MiB")
    ap.add_argument("--serve-prompts", type=int, default=24)
    ap.add_argument("--serve-input-len", type=int, default=768)
    ap.add_argument("--serve-output-len", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--skip-admission", action="store_true")
    ap.add_argument("--skip-presets", action="store_true")
    ap.add_argument("--skip-composition", action="store_true")
    ap.add_argument("--composition-budget", type=int, default=512)
    ap.add_argument("--composition-output-len", type=int, default=32)
    ap.add_argument("--short-input-len", type=int, default=64)
    ap.add_argument("--short-rate", type=float, default=1.5)
    ap.add_argument("--short-prompts", type=int, default=45)
    ap.add_argument("--long-input-len", type=int, default=1536)
    ap.add_argument("--long-rate", type=float, default=0.2)
    ap.add_argument("--long-prompts", type=int, default=6)
    ap.add_argument("--output", help="write the JSON record here")
    args = ap.parse_args()
    record = {"model": args.model, "args": vars(args)}
    if not args.skip_admission:
        record["admission"] = admission(args)
        if args.output:  # kept even if the preset part fails
            Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    if not args.skip_presets:
        record["presets"] = presets(args)
    if not args.skip_composition:
        record["composition"] = composition(args)
    text = json.dumps(record, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
