#!/usr/bin/env python3
"""Times each of OpenMPI's all-reduce algorithms at decode- and prefill-sized
messages, beside the communicator's own reduce-scatter + all-gather.

Runs `pagellm_mpi_test --bench` (tests/mpi/communicator_test.cpp) under
mpirun once per algorithm of OpenMPI's tuned collective component, locked
with its MCA parameters, and once as pagellm runs by default (its own rules,
src/dist/mpi_communicator.cpp), rounds interleaving them. Each launch reports
the median of 50 calls per size; the table shows the median over the rounds
and, in parentheses, the slowest round (a launch-to-launch spread).

    tools/bench_allreduce.py [--ranks 2] [--rounds 3]
"""
import argparse
import csv
import io
import os
import statistics
import subprocess
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# coll_tuned_allreduce_algorithm: 0 lets OpenMPI's fixed decision pick by size
# (any such setting also turns pagellm's own rules off); None: pagellm's default.
ALGORITHMS = {None: "pagellm's default (ring for 2 ranks)", 0: "OpenMPI's fixed decision", 1: "basic linear",
              2: "nonoverlapping (reduce + bcast)", 3: "recursive doubling", 4: "ring", 5: "segmented ring",
              6: "Rabenseifner"}
OURS = "reduce-scatter + all-gather (ours)"


def run(binary, ranks, algorithm):
    # mpirun binds each rank to a core, unless there are more ranks than cores.
    bind = ["--bind-to", "none"] if ranks > os.cpu_count() else []
    lock = [] if algorithm is None else ["--mca", "coll_tuned_use_dynamic_rules", "1",
                                         "--mca", "coll_tuned_allreduce_algorithm", str(algorithm)]
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", *bind, "-np", str(ranks), *lock,
           str(binary), "--bench"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("bytes,") or line[:1].isdigit()]
    return list(csv.DictReader(io.StringIO("\n".join(rows))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=str(REPO / "build" / "pagellm_mpi_test"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    times = defaultdict(list)  # (bytes, column) -> µs per launch, in launch order
    for _ in range(args.rounds):
        for algo, name in ALGORITHMS.items():
            for row in run(args.binary, args.ranks, algo):
                column = name if row["algorithm"] == "library" else OURS
                times[(int(row["bytes"]), column)].append(float(row["median_us"]))
    sizes = sorted({b for b, _ in times})
    columns = [*ALGORITHMS.values(), OURS]
    # A slow launch: one size from 64 KiB to 1 MiB took over 1.5x the best median at that size.
    best = {b: min(statistics.median(times[(b, c)]) for c in columns) for b in sizes}
    middle = [b for b in sizes if 64 << 10 <= b <= 1 << 20]
    print("| algorithm | " + " | ".join(f"{b >> 10} KiB" if b < 1 << 20 else f"{b >> 20} MiB" for b in sizes)
          + " | slow launches |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for col in columns:
        cells = [f"{statistics.median(times[(b, col)]):.1f} ({max(times[(b, col)]):.0f})" for b in sizes]
        launches = len(times[(sizes[0], col)])
        slow = sum(any(times[(b, col)][i] > 1.5 * best[b] for b in middle) for i in range(launches))
        print(f"| {col} | " + " | ".join(cells) + f" | {slow} of {launches} |")


if __name__ == "__main__":
    main()
