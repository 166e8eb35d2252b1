#!/usr/bin/env python3
"""Two pagellm binaries side by side on the same GGUF files (A/B in one run).

For each repetition: `bench memory` (read bandwidth, the decode roofline),
then every file with both binaries, in an order that alternates from one
repetition to the next, each a `bench latency` of a PP-token prompt and TG
decode steps after the first sampled token (as tools/bench_peers.py runs
pagellm). The machine may be shared: ratios are taken per repetition (both
binaries ran within seconds of each other) and reported as medians with
[min, max]. The roofline fraction is decode tokens/s x weight bytes read per
token (from the engine record) / read bandwidth of the same repetition.

  tools/bench_decode_ab.py --a /tmp/base/pagellm --b build/pagellm \\
      --files /work/peers/models/tinyllama-1.1b-q4_k_m.gguf,gemma.gguf --reps 3
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def run(cmd) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return p.stdout


def latency(binary: str, model: str, a) -> dict:
    cmd = [binary, "bench", "latency", "--model", model, "--threads", str(a.threads), "--input-lens", str(a.pp),
           "--output-len", str(a.tg + 1), "--num-iters", "1", "--num-iters-warmup", "1"]
    record = json.loads(run(cmd))
    case = record["results"][0]
    return {"pp": case["prefill_tokens_per_s"]["median"], "tg": case["decode_tokens_per_s"]["median"],
            "decode_weight_bytes": record.get("engine", {}).get("decode_weight_bytes")}


def memory(binary: str, a) -> float:
    cmd = [binary, "bench", "memory", "--threads", str(a.threads), "--size", "1GiB", "--reps", "3"]
    return json.loads(run(cmd))["results"]["read_gb_per_s"]["median"]


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return -1.0


def spread(values) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="binary A (the base)")
    ap.add_argument("--b", required=True, help="binary B (the change)")
    ap.add_argument("--files", required=True, help="comma-separated GGUF paths")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--output-json")
    a = ap.parse_args()
    files = [f for f in a.files.split(",") if f]
    for f in files:
        if not Path(f).is_file():
            sys.exit(f"no such file: {f}")
    bins = {"A": a.a, "B": a.b}
    rows = []  # one per (rep, file): both binaries' results and the bandwidth
    for rep in range(a.reps):
        bw = memory(a.b, a)
        print(f"rep {rep + 1}/{a.reps}: read {bw:.1f} GB/s (load {loadavg():.1f})", flush=True)
        for i, f in enumerate(files):
            order = ["A", "B"] if (rep + i) % 2 == 0 else ["B", "A"]
            row = {"rep": rep, "file": f, "read_gb_per_s": bw}
            for k in order:
                row[k] = latency(bins[k], f, a)
                row[k]["load"] = loadavg()
            rows.append(row)
            print(f"  {Path(f).name:<34} A tg {row['A']['tg']:6.1f} pp {row['A']['pp']:7.1f} | "
                  f"B tg {row['B']['tg']:6.1f} pp {row['B']['pp']:7.1f} | B/A tg {row['B']['tg'] / row['A']['tg']:.2f}",
                  flush=True)
    print(f"\nmedian [min, max] over {a.reps} repetitions; ratios per repetition; roofline = read GB/s / bytes per token")
    print(f"{'file':<34} {'tg A':>7} {'tg B':>7} {'B/A tg':>18} {'B/A pp':>18} {'roofline':>9} {'A frac':>6} {'B frac':>6}")
    summary = {}
    for f in files:
        rs = [r for r in rows if r["file"] == f]
        tg_a = [r["A"]["tg"] for r in rs]
        tg_b = [r["B"]["tg"] for r in rs]
        bytes_per_token = rs[0]["B"]["decode_weight_bytes"] or rs[0]["A"]["decode_weight_bytes"]
        roof = [r["read_gb_per_s"] * 1e9 / bytes_per_token for r in rs] if bytes_per_token else []
        frac_a = [r["A"]["tg"] / x for r, x in zip(rs, roof)]
        frac_b = [r["B"]["tg"] / x for r, x in zip(rs, roof)]
        s = {"tg_a": statistics.median(tg_a), "tg_b": statistics.median(tg_b),
             "tg_ratio": [r["B"]["tg"] / r["A"]["tg"] for r in rs], "pp_ratio": [r["B"]["pp"] / r["A"]["pp"] for r in rs],
             "roofline_tokens_per_s": statistics.median(roof) if roof else None,
             "frac_a": statistics.median(frac_a) if roof else None, "frac_b": statistics.median(frac_b) if roof else None}
        summary[f] = s
        roof_s = f"{s['roofline_tokens_per_s']:9.1f}" if roof else f"{'-':>9}"
        frac_s = f"{s['frac_a']:6.2f} {s['frac_b']:6.2f}" if roof else f"{'-':>6} {'-':>6}"
        print(f"{Path(f).name:<34} {s['tg_a']:7.1f} {s['tg_b']:7.1f} {spread(s['tg_ratio']):>18} "
              f"{spread(s['pp_ratio']):>18} {roof_s} {frac_s}")
    if a.output_json:
        Path(a.output_json).write_text(json.dumps({"a": a.a, "b": a.b, "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
