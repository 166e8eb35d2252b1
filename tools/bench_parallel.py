#!/usr/bin/env python3
"""Tensor / pipeline parallel speed on one machine: `pagellm bench latency` as
1 rank x 2 threads (the baseline), 1 rank x 1 thread, TP=2 and PP=2 (2 ranks
x 1 thread under mpirun), for a long prefill, a single-sequence decode and a
batch of 8. Rounds interleave the configurations (the machine is noisy);
medians are printed as a markdown table with rank 0's time in communication.

  tools/bench_parallel.py [--model M | --dummy-shape S] [--workload W ...] [--rounds 2] [--iters 3]
                          [--balanced-stages] [--config C ...]

--balanced-stages adds PP=2 with --pipeline-layer-partition balanced (stages
balanced by the bytes of weights each reads per token) next to the default
equal layer counts.

--dummy-shape runs random weights of a real shape (tinyllama-1.1b: stages of
equal cost, where Gemma 3 270M's 262k-row output matrix makes the last stage
the heavier one).
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / "build" / "pagellm"

CONFIGS = {
    "1 rank x 2 threads": (1, ["--threads", "2"]),
    "1 rank x 1 thread": (1, ["--threads", "1"]),
    "TP=2 (2 ranks x 1 thread)": (2, ["--threads", "1", "--tensor-parallel-size", "2"]),
    "PP=2 (2 ranks x 1 thread)": (2, ["--threads", "1", "--pipeline-parallel-size", "2"]),
}
WORKLOADS = {
    "prefill 512": ["--input-len", "512", "--output-len", "2", "--batch-size", "1"],
    "decode, batch 1": ["--input-len", "32", "--output-len", "64", "--batch-size", "1"],
    "batch 8 x 128 in, 32 out": ["--input-len", "128", "--output-len", "32", "--batch-size", "8"],
    "batch 8 x 16 in, 32 out": ["--input-len", "16", "--output-len", "32", "--batch-size", "8"],
}
DEFAULT_WORKLOADS = ["prefill 512", "decode, batch 1", "batch 8 x 128 in, 32 out"]


def run(model_args, ranks, flags, workload, iters):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        args = [str(BIN), "bench", "latency", *model_args, "--num-iters", str(iters), *flags, *workload,
                "--output-json", out.name]
        if ranks > 1:
            args = [shutil.which("mpirun"), "-np", str(ranks), "--oversubscribe", "--allow-run-as-root", "--bind-to",
                    "none", *args]
        p = subprocess.run(args, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            sys.exit(f"failed: {' '.join(args)}\n{p.stderr[-3000:]}")
        j = json.loads(Path(out.name).read_text())
    r = j["results"][0]
    comm = j.get("communication", {})
    return {"prefill": r["prefill_tokens_per_s"]["median"],
            "decode": r["decode_tokens_per_s"]["median"] if r.get("decode_tokens_per_s", {}).get("count") else None,
            "comm_pct": 100 * comm["seconds"] / comm["wall_seconds"] if comm else None,
            "comm_ms_step": comm.get("ms_per_step")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=(REPO / "build" / "default-model.txt").read_text().strip())
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--dummy-shape", help="random weights of this shape instead of --model")
    ap.add_argument("--workload", action="append", choices=list(WORKLOADS), help="(repeatable) default: the first 3")
    ap.add_argument("--balanced-stages", action="store_true",
                    help="also run PP=2 with --pipeline-layer-partition balanced")
    ap.add_argument("--config", action="append", help="(repeatable) only these configurations (the baseline always)")
    a = ap.parse_args()
    if a.balanced_stages:
        CONFIGS["PP=2, balanced stages"] = (2, ["--threads", "1", "--pipeline-parallel-size", "2",
                                                "--pipeline-layer-partition", "balanced"])
    if a.config:
        for c in list(CONFIGS):
            if c != "1 rank x 2 threads" and c not in a.config:
                del CONFIGS[c]
    workloads = a.workload or DEFAULT_WORKLOADS
    model_args = (["--load-format", "dummy", "--dummy-shape", a.dummy_shape] if a.dummy_shape
                  else ["--model", a.model])
    results = {(c, w): [] for c in CONFIGS for w in workloads}
    for rnd in range(a.rounds):
        for w in workloads:
            for c, (ranks, flags) in CONFIGS.items():
                results[(c, w)].append(run(model_args, ranks, flags, WORKLOADS[w], a.iters))
                print(f"round {rnd + 1}: {w}: {c}: {results[(c, w)][-1]}", file=sys.stderr)

    def med(c, w, key):
        vals = [r[key] for r in results[(c, w)] if r[key] is not None]
        return statistics.median(vals) if vals else None

    base = "1 rank x 2 threads"
    name = f"{a.dummy_shape} (random weights)" if a.dummy_shape else Path(a.model).name
    print(f"Model: {name}; medians of {a.rounds} rounds x {a.iters} iterations.\n")
    print("| workload | configuration | prefill tok/s | decode tok/s | vs 1x2 (prefill / decode) "
          "| rank 0 in comm | comm ms/step |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for w in workloads:
        for c in CONFIGS:
            p, d = med(c, w, "prefill"), med(c, w, "decode")
            bp, bd = med(base, w, "prefill"), med(base, w, "decode")
            pct, ms = med(c, w, "comm_pct"), med(c, w, "comm_ms_step")
            ratio = f"{p / bp:.2f} / " + (f"{d / bd:.2f}" if d and bd else "-")
            print(f"| {w} | {c} | {p:.1f} | {'-' if d is None else f'{d:.1f}'} | {ratio} | "
                  f"{'-' if pct is None else f'{pct:.1f}%'} | {'-' if ms is None else f'{ms:.2f}'} |")


if __name__ == "__main__":
    main()
