#!/usr/bin/env python3
"""Start-up time of `pagellm serve` next to llama.cpp's `llama-server`, same GGUF files.

Each repetition starts each server in turn (the order alternates), on a free
port, with the same thread count and context length, and measures:
  ready_s:   launch to the first `GET /health` answered 200 (polled every 5 ms);
  rss_mib:   the process's resident memory at that moment (/proc/PID/status), and
             of it the anonymous pages (allocations) and the file pages (mapped);
then stops it (SIGTERM, then SIGKILL after 30 s). The file stays in the page
cache between runs (a warm start, as on a restart); --drop-caches empties it
before each start where the kernel allows (needs root), for a cold start.

pagellm is given --kv-cache-memory (the pool it sizes up front) and llama-server
the same context; the report puts each RSS beside the file's size and the
configured pool, which shows whether the weights are mapped and whether the
pool's pages are touched at start.

  tools/bench_startup.py --pagellm build/pagellm --llama-server /work/peers/llama-build/bin/llama-server \\
      --model build/default-model.txt --model /tmp/tinyllama-q4_0.gguf --reps 7 --output-json build/startup.json
A --model that ends in .txt names the file it holds (build/default-model.txt).
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    """Resident memory: all of it, anonymous (allocated), and file pages (the mapped model)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def healthy(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def drop_caches():
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def start_once(cmd, port, timeout):
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        while not healthy(port):
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"{cmd[0]} not ready after {timeout} s")
            time.sleep(0.005)
        ready = time.perf_counter() - t0
        return ready, rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def commands(args, model, port):
    pagellm = [args.pagellm, "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
               "--threads", str(args.threads), "--max-model-len", str(args.ctx),
               "--kv-cache-memory", args.kv_cache_memory]
    llama = [args.llama_server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
             "-t", str(args.threads), "-c", str(args.ctx), "--no-webui"]
    return {"pagellm": pagellm, "llama-server": llama}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", default="build/pagellm")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--kv-cache-memory", default="1GiB", help="pagellm's pool (sized up front)")
    ap.add_argument("--drop-caches", action="store_true", help="cold starts: empty the page cache before each")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--output-json")
    args = ap.parse_args()

    models = [Path(Path(m).read_text().strip()) if m.endswith(".txt") else Path(m) for m in args.model]
    records = []
    for model in models:
        size_mib = model.stat().st_size / 2**20
        runs = {"pagellm": [], "llama-server": []}
        for rep in range(args.reps + 1):  # the first repetition warms the page cache and is not counted
            order = ["pagellm", "llama-server"] if rep % 2 == 0 else ["llama-server", "pagellm"]
            for engine in order:
                if args.drop_caches and not drop_caches():
                    sys.exit("--drop-caches: cannot write /proc/sys/vm/drop_caches (needs root)")
                port = free_port()
                ready, rss = start_once(commands(args, model, port)[engine], port, args.timeout)
                if rep > 0:
                    runs[engine].append({"ready_s": ready, "rss_mib": rss})
                print(f"{model.name} rep {rep} {engine:12s} ready {ready:6.3f} s  rss {rss['VmRSS']:7.1f} MiB "
                      f"(anon {rss['RssAnon']:.0f}, file {rss['RssFile']:.0f})"
                      f"{' (warm-up)' if rep == 0 else ''}", file=sys.stderr, flush=True)
        summary = {}
        for engine, rs in runs.items():
            summary[engine] = {"ready_s_median": statistics.median(r["ready_s"] for r in rs),
                               "ready_s_min": min(r["ready_s"] for r in rs),
                               "ready_s_max": max(r["ready_s"] for r in rs),
                               "rss_mib_median": statistics.median(r["rss_mib"]["VmRSS"] for r in rs),
                               "anon_mib_median": statistics.median(r["rss_mib"]["RssAnon"] for r in rs),
                               "file_mib_median": statistics.median(r["rss_mib"]["RssFile"] for r in rs)}
        ratio = summary["llama-server"]["ready_s_median"] / summary["pagellm"]["ready_s_median"]
        records.append({"model": str(model), "file_mib": size_mib, "runs": runs, "summary": summary,
                        "speedup_vs_llama_server": ratio})

    print("\n| file | size | pagellm ready (s) | llama-server ready (s) | llama-server / pagellm "
          f"| pagellm RSS (pool {args.kv_cache_memory}) | llama-server RSS (ctx {args.ctx}) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in records:
        p, l = r["summary"]["pagellm"], r["summary"]["llama-server"]
        print(f"| {Path(r['model']).name} | {r['file_mib']:.0f} MiB | {p['ready_s_median']:.3f} "
              f"[{p['ready_s_min']:.3f}, {p['ready_s_max']:.3f}] | {l['ready_s_median']:.3f} "
              f"[{l['ready_s_min']:.3f}, {l['ready_s_max']:.3f}] | {r['speedup_vs_llama_server']:.2f}x "
              f"| {p['rss_mib_median']:.0f} MiB ({p['anon_mib_median']:.0f} anon, {p['file_mib_median']:.0f} file) "
              f"| {l['rss_mib_median']:.0f} MiB ({l['anon_mib_median']:.0f} anon, {l['file_mib_median']:.0f} file) |")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"args": vars(args), "records": records}, indent=1))


if __name__ == "__main__":
    main()
