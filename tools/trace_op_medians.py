#!/usr/bin/env python3
"""Median time per op over the last steps of a `--trace` timeline.

On a shared machine a whole step's time swings with preemption, while the
median of each op over many layers and steps holds up; their sum (each op's
median times its count per step) estimates an unpreempted step.

  pagellm bench latency -m model.gguf --threads 2 --input-len 512 --output-len 17 --num-iters 1 --trace t.json
  tools/trace_op_medians.py t.json --steps 12
"""
import argparse
import collections
import json
import re
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=12, help="the last N engine steps (decode, after the prompt)")
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    steps = sorted((e for e in events if e["name"] == "engine.step"), key=lambda e: e["ts"])[-a.steps:]
    if not steps:
        raise SystemExit("no engine.step events in the trace")
    ops = sorted((e for e in events if e.get("cat") == "op"), key=lambda e: e["ts"])
    per_op = collections.defaultdict(list)  # op name with the layer number taken out -> durations (us)
    for s in steps:
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        for e in ops:
            if t0 <= e["ts"] < t1:
                per_op[re.sub(r"blk\.\d+\.", "", e["name"])].append(e["dur"])
    n = len(steps)
    total = 0.0
    print(f"{'op':<28} {'median us':>10} {'per step':>9} {'us per step':>12}")
    for name, durs in sorted(per_op.items(), key=lambda kv: -statistics.median(kv[1]) * len(kv[1])):
        med, count = statistics.median(durs), len(durs) / n
        total += med * count
        print(f"{name:<28} {med:10.1f} {count:9.0f} {med * count:12.0f}")
    print(f"sum of medians {total / 1000:.2f} ms per step ({1e6 / total:.1f} tok/s); "
          f"median step {statistics.median(s['dur'] for s in steps) / 1000:.2f} ms")


if __name__ == "__main__":
    main()
