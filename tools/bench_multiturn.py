#!/usr/bin/env python3
"""Multi-turn chat with a KV pool too small for every conversation: pagellm
without and with its KV offload tier, and llama.cpp's llama-server with its
prompt cache, on the same file and the same `pagellm bench serve --multi-turn`
workload (conversations whose turns repeat a growing prefix, with think time).

Per configuration it starts the server, runs the workload, stops it; the disk
tier is then started again on the same folder and the workload repeated
("after a restart": even first turns may find their prefix on disk). Prints
TTFT p50 of first and of later turns.

  tools/bench_multiturn.py --pagellm build/pagellm --llama-server /work/peers/llama-build/bin/llama-server \\
      --model build/default-model.txt --kv-cache-memory 64MiB --output-json build/multiturn.json
"""
import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, port, timeout=300):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"{cmd[0]} exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    sys.exit(f"{cmd[0]} not ready after {timeout} s")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def workload(args, port, model_name):
    cmd = [args.pagellm, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--model", model_name,
           "--num-prompts", str(args.conversations), "--multi-turn", str(args.turns),
           "--max-concurrency", str(args.concurrency), "--input-len", str(args.input_len),
           "--turn-input-len", str(args.turn_input_len), "--output-len", str(args.output_len),
           "--think-time", str(args.think_time), "--seed", "7", "--timeout", "1800"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    mt = json.loads(out.stdout)["results"]["multi_turn"]
    failed = json.loads(out.stdout)["results"]["metrics"].get("failed", 0)
    return {"first_ms": mt["ttft_ms_first_turn"]["median"], "later_ms": mt["ttft_ms_later_turns"]["median"],
            "failed": failed}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", default="build/pagellm")
    ap.add_argument("--llama-server")
    ap.add_argument("--model", required=True, help="GGUF file, or a .txt naming one (build/default-model.txt)")
    ap.add_argument("--kv-cache-memory", default="64MiB", help="pagellm's pool, too small for every conversation")
    ap.add_argument("--ctx", type=int, default=4096, help="pagellm's --max-model-len; llama-server's -c per slot")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--turn-input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--think-time", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output-json")
    args = ap.parse_args()
    model = Path(Path(args.model).read_text().strip()) if args.model.endswith(".txt") else Path(args.model)
    name = model.stem

    base = [args.pagellm, "serve", str(model), "--host", "127.0.0.1", "--threads", str(args.threads),
            "--max-model-len", str(args.ctx), "--kv-cache-memory", args.kv_cache_memory,
            "--served-model-name", name, "--disable-log-requests"]
    disk = Path(tempfile.mkdtemp(prefix="pagellm-kv-tier-"))
    configs = [("pagellm, no tier", base, False),
               ("pagellm --kv-offload-host-gb 2", base + ["--kv-offload-host-gb", "2"], False),
               ("pagellm --kv-offload-dir", base + ["--kv-offload-dir", str(disk)], True)]
    if args.llama_server:
        configs.append(("llama-server (prompt cache)", [args.llama_server, "-m", str(model), "--host", "127.0.0.1",
                                                        "-t", str(args.threads), "-np", str(args.concurrency),
                                                        "-c", str(args.ctx * args.concurrency), "--alias", name,
                                                        "--no-webui"], False))
    rows = []
    for label, cmd, restart in configs:
        for run in (["first start", "after a restart"] if restart else ["first start"]):
            port = free_port()
            proc = start(cmd + ["--port", str(port)], port)
            try:
                r = workload(args, port, name)
            finally:
                stop(proc)
            r.update(config=label, run=run)
            rows.append(r)
            print(f"{label:32s} {run:16s} TTFT p50 first turns {r['first_ms']:8.1f} ms, later turns "
                  f"{r['later_ms']:8.1f} ms, failed {r['failed']}", file=sys.stderr, flush=True)
    shutil.rmtree(disk, ignore_errors=True)
    base_later = rows[0]["later_ms"]
    print(f"\n{args.conversations} conversations x {args.turns} turns, {args.concurrency} at once; first prompt "
          f"{args.input_len} tokens, +{args.turn_input_len} per turn, replies of {args.output_len}; think time "
          f"{args.think_time} s; pagellm's pool {args.kv_cache_memory}\n")
    print("| server | run | TTFT p50, first turns | TTFT p50, later turns | later turns vs no tier |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['run']} | {r['first_ms']:.0f} ms | {r['later_ms']:.0f} ms | "
              f"{base_later / r['later_ms']:.1f}x |")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
