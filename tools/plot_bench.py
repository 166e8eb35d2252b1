#!/usr/bin/env python3
"""PNG plots of `pagellm bench serve` JSON records.

Each argument is a JSON file written by `pagellm bench serve --output-json`,
optionally prefixed with a series label: LABEL=FILE. Records with the same
label form one series over their --max-concurrency. Writes two plots:
  <out>-throughput.png  output tokens/s and requests/s vs concurrent clients
  <out>-latency.png     TTFT and ITL p50 / p90 / p99 vs concurrent clients

  for c in 1 4 8 16; do
    build/pagellm bench serve --max-concurrency $c --num-prompts 32 --output-json serve-c$c.json
  done
  tools/plot_bench.py pagellm=serve-c1.json pagellm=serve-c4.json ... -o docs/img/serve

--peer FILE[:WEIGHTS] adds llama-server's figures from the markdown table
"llama-server, continuous batching" in ../shared/data/peer-figures.md (rows
of WEIGHTS, default Q4_0; it gives p50 latencies only).

matplotlib is only needed here (pip install matplotlib).
"""
import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def load(arg: str):
    label, sep, path = arg.partition("=")
    if not sep:
        label, path = "", arg
    record = json.loads(Path(path).read_text())
    if record.get("mode") != "serve":
        sys.exit(f"{path}: not a `bench serve` record (mode {record.get('mode')!r})")
    res = record["results"]
    if not label:
        label = res.get("model") or "run"
    clients = res["max_concurrency"] or res["num_prompts"]
    return label, clients, res["metrics"]


def load_peer(arg: str):
    """(label, [(clients, metrics)]) from peer-figures.md's llama-server table."""
    path, _, weights = arg.partition(":")
    weights = weights or "Q4_0"
    points, in_table = [], False
    for line in Path(path).read_text().splitlines():
        if line.startswith("## "):
            in_table = "llama-server" in line
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table or len(cells) != 5 or cells[0] != weights:
            continue
        clients, tok_s, ttft, itl = int(cells[1]), float(cells[2]), cells[3], cells[4]
        ttft_ms = float(ttft.split()[0]) * (1000 if ttft.endswith(" s") else 1)
        itl_ms = float(itl.split()[0]) * (1000 if itl.endswith(" s") else 1)
        points.append((clients, {"output_throughput": tok_s, "request_throughput": None,
                                 "ttft_ms": {"median": ttft_ms}, "itl_ms": {"median": itl_ms}}))
    if not points:
        sys.exit(f"{path}: no llama-server rows for {weights}")
    return f"llama.cpp server {weights} (peer figures)", sorted(points, key=lambda p: p[0])


def main():
    ap = argparse.ArgumentParser(description="Plot bench serve results")
    ap.add_argument("records", nargs="+", help="[LABEL=]FILE.json")
    ap.add_argument("-o", "--out", default="serve", help="output path prefix")
    ap.add_argument("--title", default="", help="title prefix")
    ap.add_argument("--peer", help="peer-figures.md[:WEIGHTS]: add llama-server's figures as a series")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = defaultdict(list)
    for arg in args.records:
        label, clients, metrics = load(arg)
        series[label].append((clients, metrics))
    for points in series.values():
        points.sort(key=lambda p: p[0])
    if args.peer:
        label, points = load_peer(args.peer)
        series[label] = points

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, points in series.items():
        xs = [c for c, _ in points]
        ax1.plot(xs, [m["output_throughput"] for _, m in points], marker="o", label=label)
        if all(m["request_throughput"] is not None for _, m in points):
            ax2.plot(xs, [m["request_throughput"] for _, m in points], marker="o", label=label)
    for ax, ylabel in ((ax1, "output tokens/s"), (ax2, "requests/s")):
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"{args.title} throughput vs concurrency".strip())
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(f"{out}-throughput.png", dpi=120)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"median": "-", "p90": "--", "p99": ":"}
    for ax, key, name in ((ax1, "ttft_ms", "TTFT"), (ax2, "itl_ms", "ITL")):
        for i, (label, points) in enumerate(series.items()):
            xs = [c for c, _ in points]
            for stat, style in styles.items():
                if any(stat not in m[key] for _, m in points):
                    continue
                ax.plot(xs, [m[key][stat] for _, m in points], style, marker="o", color=f"C{i}",
                        label=f"{label} {'p50' if stat == 'median' else stat}")
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{args.title} latency percentiles".strip())
    fig.tight_layout()
    fig.savefig(f"{out}-latency.png", dpi=120)
    print(f"wrote {out}-throughput.png and {out}-latency.png", file=sys.stderr)


if __name__ == "__main__":
    main()
