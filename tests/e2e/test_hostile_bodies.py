"""Hostile request bodies: deep nesting used to crash the server (SIGSEGV when a
handler copied the DOM), and DOM-heavy bodies used to take gigabytes. The JSON
pre-scan refuses both with a 400 before nlohmann allocates."""
import concurrent.futures
from pathlib import Path

import requests

DEPTH = 100_000


def post_raw(server, path, data):
    return requests.post(server.url(path), data=data, headers={"Content-Type": "application/json"}, timeout=60)


def deep_object():
    return '{"a":' * DEPTH + "1" + "}" * DEPTH


def peak_rss_bytes(server):
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def check_400(r, contains):
    assert r.status_code == 400, r.text[:300]
    assert contains in r.json()["error"]["message"], r.json()


def test_deep_bodies_get_400_and_the_server_lives(stories_server):
    bodies = {
        "/v1/chat/completions": '{"messages": [{"role": "user", "content": ' + deep_object() + "}]}",
        "/tokenize": '{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": '
                     + deep_object() + "}",
        "/v1/completions": '{"prompt": "x", "extra": ' + "[" * DEPTH + "]" * DEPTH + "}",
    }
    for path, body in bodies.items():
        check_400(post_raw(stories_server, path, body), "JSON nesting depth exceeds the limit of 64")
    assert requests.get(stories_server.url("/health"), timeout=10).status_code == 200
    assert stories_server.proc.poll() is None


def test_concurrent_dom_heavy_bodies_are_refused_before_parsing(stories_server):
    # 15 MB of "[{},{},...]" each: ~560 MB of DOM apiece before, 4.5 GB for eight.
    body = '{"prompt": "x", "messages": [' + ",".join(["{}"] * 5_000_000) + "]}"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: post_raw(stories_server, "/v1/chat/completions", body), range(8)))
    for r in replies:
        check_400(r, "JSON estimated memory exceeds the limit of 67108864 bytes")
    # Eight bodies held at once by the HTTP layer (~120 MB) plus the model;
    # never the DOMs.
    assert peak_rss_bytes(stories_server) < 1024 ** 3
    assert requests.get(stories_server.url("/health"), timeout=10).status_code == 200
