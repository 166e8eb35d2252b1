#!/usr/bin/env python3
"""Multi-turn chat with a KV pool too small for every conversation: pagellm
without and with its KV offload tier, and llama.cpp's llama-server with its
prompt cache, on the same file and the same `pagellm bench serve --multi-turn`
workload (conversations whose turns repeat a growing prefix, with think time).

Per configuration it starts the server, runs the workload, stops it; the disk
tier is then started again on the same folder and the workload repeated
("after a restart": even first turns may find their prefix on disk). The
llama-server peer does the same with its slot save/restore: each slot is
saved (POST /slots/N?action=save) before the stop and restored after the
start. Prints TTFT p50 of first and of later turns.

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
import urllib.error
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


def slots(port, n, action):
    """llama-server's slot save/restore (--slot-save-path): one file per slot."""
    for i in range(n):
        body = json.dumps({"filename": f"slot{i}.bin"}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/slots/{i}?action={action}", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=600).read()
        except urllib.error.HTTPError as e:  # an empty slot has nothing to save or restore
            print(f"  slot {i} {action}: HTTP {e.code} {e.read()[:120]!r}", file=sys.stderr)


def tier_metrics(port):
    """pagellm's offload-tier counters (empty for a server without them)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("pagellm:kv_offload_") or line.startswith("pagellm_kv_offload_"):
            key, _, value = line.rpartition(" ")
            out[key.split(":", 1)[-1]] = float(value)
    return out


def workload(args, port, model_name, model_file):
    # The model's own tokenizer makes the prompts exactly --input-len tokens long.
    cmd = [args.pagellm, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--model", model_name,
           "--tokenizer", str(model_file),
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
    ap.add_argument("--ctx", type=int, default=2048, help="pagellm's --max-model-len; llama-server's -c per slot")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8, help="conversations at once")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--turn-input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--think-time", type=float, default=2.0)
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
    slot_dir = Path(tempfile.mkdtemp(prefix="llama-slots-"))
    if args.llama_server:
        llama_cmd = [args.llama_server, "-m", str(model), "--host", "127.0.0.1", "-t", str(args.threads),
                 "-np", str(args.concurrency), "-c", str(args.ctx * args.concurrency), "--alias", name, "--no-webui"]
        configs.append(("llama-server (prompt cache)", llama_cmd, False))
        # A restored slot is reused only with whole sliding-window layers in
        # it (--swa-full; Gemma 3): without, the next prompt is recomputed.
        configs.append(("llama-server --swa-full (prompt cache, slot save/restore)",
                        llama_cmd + ["--swa-full", "--slot-save-path", f"{slot_dir}/"], True))
    rows = []
    for label, cmd, restart in configs:
        llama = cmd[0] == args.llama_server
        for run in (["first start", "after a restart"] if restart else ["first start"]):
            port = free_port()
            proc = start(cmd + ["--port", str(port)], port)
            try:
                if llama and run == "after a restart":
                    slots(port, args.concurrency, "restore")
                r = workload(args, port, name, model)
                r["tier"] = {} if llama else tier_metrics(port)
                if llama and restart and run == "first start":  # before the stop
                    slots(port, args.concurrency, "save")
            finally:
                stop(proc)
            r.update(config=label, run=run)
            rows.append(r)
            print(f"{label:32s} {run:16s} TTFT p50 first turns {r['first_ms']:8.1f} ms, later turns "
                  f"{r['later_ms']:8.1f} ms, failed {r['failed']}", file=sys.stderr, flush=True)
            for key, value in r["tier"].items():
                if value and ("total" in key or "blocks{" in key):
                    print(f"    {key} {value:g}", file=sys.stderr)
    shutil.rmtree(disk, ignore_errors=True)
    shutil.rmtree(slot_dir, ignore_errors=True)
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
