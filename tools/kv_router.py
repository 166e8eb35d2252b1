#!/usr/bin/env python3
"""A small cache-aware router: each request goes to the replica whose prefix
cache holds the longest prefix of its prompt.

It follows every replica's KV events (GET /v1/kv_events, Server-Sent Events;
start the replicas with --kv-events) and keeps, per replica, the blocks it has
stored as a token trie: a block is found by (its parent block's hash, its
token ids), so the router never needs the engine's hash function. A prompt is
tokenized by a replica's /tokenize (chat messages too), walked through each
trie a block at a time, and the request is proxied, streaming or not, to the
replica with the longest match; ties go to the replica with the fewest
requests in flight, then round robin. Responses carry X-Routed-To (the
replica's URL) and X-Prefix-Cached-Tokens (the match the router saw).

    python tools/kv_router.py --port 8000 http://127.0.0.1:8001 http://127.0.0.1:8002

GET /router/state shows what it knows. Limitations: LoRA adapters' prefixes
are not matched (base model only); a replica that cannot be reached is still
chosen by round robin (its error goes back to the client).
"""

import argparse
import itertools
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

log = logging.getLogger("kv_router")
ROUTED = ("/v1/completions", "/v1/chat/completions")
ROOT = ("root", None)  # the parent of a sequence's first block (base model)


class Replica:
    def __init__(self, url, api_key=None):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.lock = threading.Lock()
        self.blocks = {}    # hash -> its key in children
        self.children = {}  # (parent hash or ROOT, token ids) -> hash
        self.block_size = 0
        self.in_flight = 0
        self.seq = 0        # the last event batch applied

    def apply(self, event):
        kind = event["type"]
        if kind == "AllBlocksCleared":
            self.blocks.clear()
            self.children.clear()
        elif kind == "BlockRemoved":
            for h in event["block_hashes"]:
                key = self.blocks.pop(h, None)
                if key is not None and self.children.get(key) == h:
                    del self.children[key]
        elif kind == "BlockStored" and not event.get("lora_id"):
            bs = self.block_size = event["block_size"]
            parent, tokens = event["parent_block_hash"], event["token_ids"]
            parent = ROOT if parent is None else parent
            for i, h in enumerate(event["block_hashes"]):
                key = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
                self.blocks[h] = key
                self.children[key] = h
                parent = h

    def follow(self):
        """Applies the replica's event stream forever, reconnecting after errors
        (a reconnect starts with a snapshot, so nothing is lost)."""
        while True:
            try:
                with requests.get(self.url + "/v1/kv_events", headers=self.headers, stream=True,
                                  timeout=(5, 60)) as r:
                    r.raise_for_status()
                    for line in r.iter_lines(chunk_size=None):
                        if line.startswith(b"data:"):
                            batch = json.loads(line[5:])
                            with self.lock:
                                for event in batch["events"]:
                                    self.apply(event)
                                self.seq = batch["seq"]
            except (requests.RequestException, ValueError, KeyError) as e:
                log.warning("%s: KV events: %s; reconnecting", self.url, e)
            time.sleep(1)

    def cached_tokens(self, tokens):
        """How many leading tokens this replica holds as stored blocks."""
        with self.lock:
            bs, parent, n = self.block_size, ROOT, 0
            while bs and (n + 1) * bs <= len(tokens):
                parent = self.children.get((parent, tuple(tokens[n * bs:(n + 1) * bs])))
                if parent is None:
                    break
                n += 1
            return n * bs


class Router:
    def __init__(self, urls, api_key=None, policy="prefix"):
        self.replicas = [Replica(u, api_key) for u in urls]
        self.policy = policy
        self.turn = itertools.count()
        for r in self.replicas:
            threading.Thread(target=r.follow, daemon=True).start()

    def tokenize(self, path, body):
        """The prompt's token ids as the replicas see them, or [] when unknown."""
        if path.endswith("/chat/completions"):
            query = {k: body[k] for k in ("messages", "tools", "chat_template_kwargs") if k in body}
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
                return prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                prompt = prompt[0]
            if not isinstance(prompt, str):
                return []
            query = {"prompt": prompt}
        for r in self.replicas:
            try:
                resp = requests.post(r.url + "/tokenize", json=query, headers=r.headers, timeout=30)
                if resp.status_code == 200:
                    return resp.json()["tokens"]
                return []  # a bad request: the replica will say why
            except requests.RequestException:
                continue
        return []

    def choose(self, tokens):
        """(replica, cached tokens): the longest match, then the least loaded,
        then the next in turn."""
        start = next(self.turn) % len(self.replicas)
        order = self.replicas[start:] + self.replicas[:start]
        if self.policy == "round-robin":
            return order[0], order[0].cached_tokens(tokens) if tokens else 0
        scored = [(r.cached_tokens(tokens) if tokens else 0, -r.in_flight, r) for r in order]
        best = max(scored, key=lambda s: s[:2])  # max keeps the first of equals
        return best[2], best[0]

    def state(self):
        return [{"url": r.url, "blocks": len(r.blocks), "block_size": r.block_size, "seq": r.seq,
                 "in_flight": r.in_flight} for r in self.replicas]


class Handler(BaseHTTPRequestHandler):
    router = None  # set by main
    protocol_version = "HTTP/1.0"  # the response ends when the connection closes: streams need no framing

    def do_GET(self):
        if self.path == "/router/state":
            return self.reply(200, json.dumps(self.router.state()).encode(), "application/json")
        self.forward(None, None)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        tokens = []
        if self.path.split("?")[0] in ROUTED and self.router.policy == "prefix":
            try:
                tokens = self.router.tokenize(self.path, json.loads(raw))
            except (ValueError, AttributeError):
                pass  # not JSON: the replica answers with the error
        self.forward(raw, tokens)

    def forward(self, raw, tokens):
        replica, cached = self.router.choose(tokens or [])
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "x-api-key")}
        with replica.lock:
            replica.in_flight += 1
        try:
            upstream = requests.request(self.command, replica.url + self.path, data=raw, headers=headers,
                                        stream=True, timeout=(5, 600))
        except requests.RequestException as e:
            with replica.lock:
                replica.in_flight -= 1
            return self.reply(502, json.dumps({"error": {"message": f"{replica.url}: {e}"}}).encode(),
                              "application/json")
        try:
            self.send_response(upstream.status_code)
            self.send_header("Content-Type", upstream.headers.get("Content-Type", "application/json"))
            self.send_header("X-Routed-To", replica.url)
            self.send_header("X-Prefix-Cached-Tokens", str(cached))
            self.end_headers()
            for chunk in upstream.iter_content(chunk_size=None):
                self.wfile.write(chunk)
                self.wfile.flush()
        except OSError:
            pass  # the client left; closing upstream aborts the request there
        finally:
            upstream.close()
            with replica.lock:
                replica.in_flight -= 1

    def reply(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        log.info("%s " + fmt, self.address_string(), *args)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("replicas", nargs="+", help="replica base URLs (servers started with --kv-events)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="the replicas' --api-key, for their /v1/kv_events and /tokenize")
    p.add_argument("--policy", choices=["prefix", "round-robin"], default="prefix",
                   help="round-robin ignores the caches (to compare against)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    Handler.router = Router(args.replicas, args.api_key, args.policy)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    log.info("routing on http://%s:%d to %s", args.host, args.port, ", ".join(args.replicas))
    server.serve_forever()


if __name__ == "__main__":
    main()
