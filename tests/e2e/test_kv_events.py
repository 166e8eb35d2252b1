"""KV events (--kv-events) on GET /v1/kv_events, and tools/kv_router.py in
front of two replicas: a request whose prefix one replica holds goes there."""

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

import prom
from conftest import BIN, REPO, STORIES, Server, free_port

# ~300 tokens of stories260K's vocabulary: 18 full blocks of 16.
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
          "friends. One day, she saw a big red ball under a tree and ran to get it. ") * 5
OTHER = ("The sun was hot and the dog was sleepy. Tom gave him some water and a bone, and they sat in the "
         "shade of the big old house. ") * 5
KEY = "sk-kv-events"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Subscriber:
    """Reads a /v1/kv_events stream on a thread; `batches` fills as it goes.
    A plain socket, so that close() ends it at once (requests would wait for
    the stream's next bytes)."""

    def __init__(self, server, headers=AUTH):
        self.batches = []
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock.sendall(f"GET /v1/kv_events HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode())
        self.file = self.sock.makefile("rb")
        status = self.file.readline().decode()
        lines = []
        while (line := self.file.readline()) not in (b"\r\n", b""):
            lines.append(line.decode().lower())
        self.status = int(status.split()[1])
        assert self.status == 200, status
        assert "content-type: text/event-stream" in "".join(lines)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for line in self.file:  # chunk-size lines in between are skipped
                if line.startswith(b"data: "):
                    self.batches.append(json.loads(line[6:]))
        except (OSError, ValueError):
            pass  # closed by the test or the server

    def events(self):
        return [e for b in list(self.batches) for e in b["events"]]

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def stored_prefix(events):
    """Token ids of the longest chain of stored blocks from a sequence's start."""
    blocks, children = {}, {}
    for e in events:
        if e["type"] == "AllBlocksCleared":
            blocks.clear()
            children.clear()
        elif e["type"] == "BlockStored":
            parent, bs = e["parent_block_hash"], e["block_size"]
            for i, h in enumerate(e["block_hashes"]):
                blocks[h] = e["token_ids"][i * bs:(i + 1) * bs]
                children.setdefault(parent, []).append(h)
                parent = h
        elif e["type"] == "BlockRemoved":
            for h in e["block_hashes"]:
                blocks.pop(h, None)
    out, parent = [], None
    while True:
        live = [h for h in children.get(parent, []) if h in blocks]
        if not live:
            return out
        parent = max(live, key=lambda h: len(blocks[h]))
        out += blocks[parent]


def wait_until(cond, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def tokens_of(server, prompt):
    r = requests.post(server.url("/tokenize"), json={"prompt": prompt}, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def complete(base, prompt, headers=AUTH, stream=False):
    r = requests.post(base + "/v1/completions", headers=headers, timeout=120, stream=stream,
                      json={"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": stream,
                            **({"stream_options": {"include_usage": True}} if stream else {})})
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(l[6:]) for l in r.iter_lines() if l.startswith(b"data: {")]
        usage = chunks[-1]["usage"]
    else:
        usage = r.json()["usage"]
    return r, (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


@pytest.fixture(scope="module")
def events_server():
    s = Server(["--kv-events", "--api-key", KEY]).start()
    yield s
    s.stop()


def test_off_by_default(stories_server):
    r = requests.get(stories_server.url("/v1/kv_events"), timeout=10)
    assert r.status_code == 404
    assert "--kv-events" in r.json()["error"]["message"]


def test_needs_the_api_key(events_server):
    assert requests.get(events_server.url("/v1/kv_events"), timeout=10).status_code == 401


def test_a_request_publishes_its_blocks(events_server):
    sub = Subscriber(events_server)
    try:
        assert wait_until(lambda: sub.batches), "no snapshot"
        assert sub.batches[0]["events"][0]["type"] == "AllBlocksCleared"
        tokens = tokens_of(events_server, PROMPT)
        complete(events_server.base, PROMPT)
        full = (len(tokens) - 1) // 16 * 16  # the last prompt token's block may be partial
        assert wait_until(lambda: stored_prefix(sub.events())[:full] == tokens[:full]), sub.events()[:3]
        seqs = [b["seq"] for b in sub.batches]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        stored = [e for e in sub.events() if e["type"] == "BlockStored"]
        assert all(e["block_size"] == 16 and e["lora_id"] is None and e["medium"] == "CPU" for e in stored)
        assert stored[0]["parent_block_hash"] is None
        assert isinstance(sub.batches[-1]["ts"], float)
    finally:
        sub.close()
    # A subscriber that starts late learns the state from its snapshot.
    late = Subscriber(events_server)
    try:
        assert wait_until(lambda: late.batches)
        assert stored_prefix(late.batches[0]["events"])[:full] == tokens[:full]
    finally:
        late.close()
    m = prom.parse(requests.get(events_server.url("/metrics"), timeout=10).text)
    assert prom.value(m, "pagellm:kv_events_published_total") > 0
    assert prom.value(m, "pagellm:kv_events_stored_blocks") >= full // 16


def test_a_subscriber_does_not_hold_up_shutdown():
    server = Server(["--kv-events"]).start()
    sub = Subscriber(server, headers={})
    try:
        assert wait_until(lambda: sub.batches)
        started = time.time()
        assert server.stop(timeout=30) == 0, server.output()
        assert time.time() - started < 15
    finally:
        sub.close()
        server.kill()


@pytest.mark.parametrize("config, message", [
    ('{"enable_kv_cache_events": true, "publisher": "zmq"}', "publisher"),
    ('{"enable_kv_cache_events": 1}', "enable_kv_cache_events"),
    ("not json", "JSON"),
])
def test_kv_events_config_errors(config, message):
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    p = subprocess.run([str(BIN), "serve", str(STORIES), "--kv-events-config", config], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and p.returncode < 128
    assert message in p.stderr, p.stderr


def test_kv_events_config_turns_them_on():
    server = Server(["--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "http", '
                                           '"max_queue_size": 1000}']).start()
    try:
        sub = Subscriber(server, headers={})
        assert wait_until(lambda: sub.batches)
        sub.close()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def routed():
    """Two replicas with KV events and the router in front of them."""
    replicas = [Server(["--kv-events"]).start() for _ in range(2)]
    port = free_port()
    router = subprocess.Popen([sys.executable, str(REPO / "tools" / "kv_router.py"), "--port", str(port),
                               *[r.base for r in replicas]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"

    def state():
        try:
            return requests.get(base + "/router/state", timeout=2).json()
        except requests.RequestException:
            return None

    try:
        assert wait_until(lambda: (s := state()) and all(r["seq"] > 0 for r in s)), "router did not subscribe"
        yield base, replicas, state
    finally:
        router.terminate()
        router.wait(10)
        for r in replicas:
            r.stop()


def test_the_router_sends_a_prefix_where_it_is_cached(routed):
    base, replicas, state = routed
    r, cached = complete(base, PROMPT)
    first = r.headers["X-Routed-To"]
    assert first in [s.base for s in replicas]
    assert cached == 0 and r.headers["X-Prefix-Cached-Tokens"] == "0"
    assert wait_until(lambda: any(s["url"] == first and s["blocks"] >= 16 for s in state()))
    # The same prefix with another ending, twice: round robin would alternate.
    for suffix in (" Lily smiled.", " The end."):
        r, cached = complete(base, PROMPT + suffix, stream=suffix == " The end.")
        assert r.headers["X-Routed-To"] == first
        assert cached >= 256
        assert int(r.headers["X-Prefix-Cached-Tokens"]) >= 256
    # A prompt no replica holds: the least loaded, in turn.
    r, cached = complete(base, OTHER)
    assert cached == 0


def test_eviction_publishes_removed_blocks():
    """A pool of ~40 blocks cannot keep three ~19-block prompts: the oldest
    prompt's blocks are evicted, and each eviction is a BlockRemoved of a
    block announced before."""
    server = Server(["--kv-events", "--kv-cache-memory", "400KiB"]).start()
    try:
        sub = Subscriber(server, headers={})
        assert wait_until(lambda: sub.batches)
        third = PROMPT.replace("Lily", "Sue").replace("ball", "kite")
        for prompt in (PROMPT, OTHER, third):
            complete(server.base, prompt, headers={})
        assert wait_until(lambda: any(e["type"] == "BlockRemoved" for e in sub.events())), server.output()[-2000:]
        announced = set()
        for e in sub.events():
            if e["type"] == "BlockStored":
                announced.update(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                assert set(e["block_hashes"]) <= announced
                announced -= set(e["block_hashes"])
        # What the stream's events add up to is what a new subscriber's snapshot says.
        late = Subscriber(server, headers={})
        assert wait_until(lambda: late.batches and sub.batches[-1]["seq"] == late.batches[0]["seq"])
        snapshot = {h for e in late.batches[0]["events"] if e["type"] == "BlockStored" for h in e["block_hashes"]}
        assert snapshot == announced
        assert 0 < len(snapshot) <= 40
        sub.close()
        late.close()
    finally:
        server.stop()
