"""Hostile clients at the HTTP layer (issue 9): clients that vanish in every
way, oversized or compressed bodies, header floods, slow clients, connection
storms. Each test is a reproduction that once crashed, stalled or bloated the
server; the server must answer a clean error and stay healthy."""

import gzip
import json
import socket
import struct
import threading
import time
import zlib

import pytest
import requests

from conftest import STORIES, Server
import prom


def metric(server, name):
    families = prom.parse(requests.get(server.url("/metrics"), timeout=10).text)
    return families[name]["samples"][0][2]


def wait_idle(server, timeout=5.0):
    """Seconds until no request runs or waits and the KV cache is empty."""
    start = time.time()
    while time.time() - start < timeout:
        if (metric(server, "pagellm:num_requests_running") == 0 and metric(server, "pagellm:num_requests_waiting") == 0
                and metric(server, "pagellm:kv_cache_usage_perc") == 0):
            return time.time() - start
        time.sleep(0.05)
    raise AssertionError(f"the server did not return to idle within {timeout} s")


def finished_total(server):
    families = prom.parse(requests.get(server.url("/metrics"), timeout=10).text)
    return sum(v for _, _, v in families["pagellm:request_success_total"]["samples"])


def wait_running(server, timeout=10.0, fail=True):
    """Polls until some request runs: a loaded machine may take longer than
    a fixed pause to admit the first one. Fails with what the server saw
    (or, with fail=False, returns False)."""
    deadline = time.time() + timeout
    polls = 0
    start_finished = finished_total(server)
    while time.time() < deadline:
        polls += 1
        if metric(server, "pagellm:num_requests_running") > 0:
            return True
        time.sleep(0.02)
    if not fail:
        return False
    text = requests.get(server.url("/metrics"), timeout=10).text
    seen = [l for l in text.splitlines() if l.startswith(("pagellm:num_requests", "pagellm:request_success",
                                                          "pagellm:http_requests"))]
    raise AssertionError(f"no request ran in {timeout} s ({polls} polls; {start_finished:.0f} finished before); "
                         "metrics:\n" + "\n".join(seen) + "\nserver log tail:\n" + server.output()[-3000:])


def send_long_requests(server, stream=False, count=48, attempts=3):
    """Opens `count` connections, each sending a long completion (~23,000
    tokens in all: seconds of work for 8 slots), and returns their sockets
    once a request runs. If a batch ran to its end unseen by the polls (a
    stalled test process on a loaded machine), a fresh batch is sent."""
    for attempt in range(attempts):
        socks = []
        for _ in range(count):
            s = connect(server)
            s.sendall(http_request("POST", "/v1/completions", completion_body(480, stream),
                                   ["Content-Type: application/json"]))
            socks.append(s)
        if wait_running(server, fail=attempt == attempts - 1):
            return socks
        for s in socks:
            s.close()
        wait_idle(server, timeout=30)
    return []


def connect(server):
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def http_request(method, path, body=b"", headers=()):
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    head += list(headers)
    if body and not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def read_response(sock, timeout=30, pending=None):
    """(status, headers, body) of one response; skips interim 1xx replies.
    `pending` (a bytearray) carries bytes of the next responses between calls."""
    sock.settimeout(timeout)
    buf = bytes(pending or b"")
    while True:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before a response head: {buf[:200]!r}")
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
        if 100 <= status < 200:
            continue
        break
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
        if pending is not None:
            pending[:] = buf[n:]
        return status, headers, buf[:n]
    # Chunked (streams) or close-delimited: read to the end.
    while True:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        buf += chunk
        if buf.endswith(b"0\r\n\r\n"):
            break
    return status, headers, buf


def completion_body(max_tokens=8, stream=False):
    return json.dumps({"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": stream}).encode()


def healthy(server):
    r = requests.post(server.url("/v1/completions"), data=completion_body(), timeout=30,
                      headers={"Content-Type": "application/json"})
    return r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8


@pytest.fixture(scope="module")
def server():
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    s = Server(["--max-num-seqs", "8", "--max-request-bytes", "1MiB", "--http-threads", "8", "--max-connections",
                "600", "--header-timeout", "2", "--body-timeout", "3", "--timeout-keep-alive", "2"]).start()
    yield s
    assert s.stop() == 0, s.output()


@pytest.mark.parametrize("stream", [False, True])
def test_reset_right_after_sending_aborts(server, stream):
    """SO_LINGER 0 resets the connection: the peer address is gone too. Every
    such request must be aborted and its KV blocks freed within 2 s."""
    socks = send_long_requests(server, stream)
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    assert wait_idle(server, timeout=2.5) < 2.5
    assert healthy(server)


def test_close_after_sending_aborts(server):
    """A plain close (FIN) with the request running: aborted too."""
    socks = send_long_requests(server)
    for s in socks:
        s.close()
    assert wait_idle(server, timeout=2.5) < 2.5


@pytest.mark.parametrize("path,method,body", [
    ("/health", "GET", b""),
    ("/v1/completions", "POST", None),
])
def test_half_close_after_sending_still_gets_the_reply(server, path, method, body):
    body = completion_body(32) if body is None else body
    s = connect(server)
    s.sendall(http_request(method, path, body, ["Content-Type: application/json"] if body else []))
    s.shutdown(socket.SHUT_WR)
    status, _, reply = read_response(s)
    s.close()
    assert status == 200
    if body:
        assert json.loads(reply)["usage"]["completion_tokens"] == 32


def test_half_close_streaming_still_gets_the_stream(server):
    s = connect(server)
    s.sendall(http_request("POST", "/v1/completions", completion_body(16, stream=True),
                           ["Content-Type: application/json"]))
    s.shutdown(socket.SHUT_WR)
    status, _, reply = read_response(s)
    s.close()
    assert status == 200
    assert b"data: [DONE]" in reply


def test_chunked_body_limit_on_the_wire(server):
    """A chunked body past --max-request-bytes is refused as it arrives, not
    buffered whole first (the rest is read and dropped while the server
    lingers, so the client can read the 413)."""
    before = server.rss_bytes()
    s = connect(server)
    s.sendall(http_request("POST", "/v1/completions", b"", ["Transfer-Encoding: chunked",
                                                             "Content-Type: application/json"]))
    chunk = b"x" * 65536
    sent = 0
    try:
        while sent < 64 << 20:
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    status, _, body = read_response(s)
    s.close()
    assert status == 413, body
    assert "limit of 1048576 bytes" in json.loads(body)["error"]["message"]
    assert server.rss_bytes() - before < 32 << 20
    assert healthy(server)


def test_gzip_bomb_is_refused_without_inflating(server):
    bomb = gzip.compress(b"\0" * (1 << 30), compresslevel=9)  # ~1 MB -> 1 GiB
    assert len(bomb) < (1 << 20)
    before = server.rss_bytes()
    r = requests.post(server.url("/v1/completions"), data=bomb, timeout=60,
                      headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 413
    assert "decompressed request body exceeds" in r.json()["error"]["message"]
    assert server.rss_bytes() - before < 64 << 20
    assert healthy(server)


@pytest.mark.parametrize("encoding,compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_compressed_bodies_work(server, encoding, compress):
    r = requests.post(server.url("/v1/completions"), data=compress(completion_body()), timeout=30,
                      headers={"Content-Type": "application/json", "Content-Encoding": encoding})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8


def test_unknown_content_encoding_is_415(server):
    r = requests.post(server.url("/v1/completions"), data=b"xx", timeout=30,
                      headers={"Content-Type": "application/json", "Content-Encoding": "br"})
    assert r.status_code == 415
    assert r.json()["error"]["message"].startswith("Content-Encoding 'br' is not supported")


def test_a_million_header_lines_is_431(server):
    before = server.rss_bytes()
    s = connect(server)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    try:
        for _ in range(100):
            s.sendall(b"a: b\r\n" * 10000)
    except (BrokenPipeError, ConnectionResetError):
        pass
    status, _, body = read_response(s)
    s.close()
    assert status == 431, body
    assert server.rss_bytes() - before < 16 << 20
    assert healthy(server)


def test_header_count_limit(server):
    headers = [f"X-H{i}: v" for i in range(101)]
    s = connect(server)
    s.sendall(http_request("GET", "/health", b"", headers))
    status, _, body = read_response(s)
    assert status == 431
    assert "more than 100 headers" in json.loads(body)["error"]["message"]


def test_long_request_line_is_414(server):
    s = connect(server)
    s.sendall(b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n")
    status, _, _ = read_response(s)
    assert status == 414


@pytest.mark.parametrize("raw,status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /health HTTP/2.0\r\n\r\n", 505),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello", 400),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
])
def test_malformed_framing(server, raw, status):
    s = connect(server)
    s.sendall(raw)
    got, _, body = read_response(s)
    assert got == status, body
    assert "error" in json.loads(body)


def test_slow_clients_do_not_stall_others(server):
    """More slow-header connections than HTTP threads: /health and
    completions keep answering, and the slow ones get 408 at the deadline."""
    stop = threading.Event()
    slow = []
    for _ in range(300):
        s = connect(server)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        slow.append(s)

    def drip():
        while not stop.is_set():
            for s in slow:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            stop.wait(0.5)

    t = threading.Thread(target=drip)
    t.start()
    try:
        for _ in range(5):
            t0 = time.time()
            assert requests.get(server.url("/health"), timeout=5).status_code == 200
            assert healthy(server)
            assert time.time() - t0 < 3
        time.sleep(2.5)  # past --header-timeout 2
        codes = []
        for s in slow[:20]:
            try:
                codes.append(read_response(s, timeout=5)[0])
            except (ConnectionError, OSError):
                codes.append(None)
        assert codes.count(408) >= 15, codes
    finally:
        stop.set()
        t.join()
        for s in slow:
            s.close()
    assert healthy(server)


def test_idle_connections_close_after_keep_alive_timeout(server):
    s = connect(server)
    s.sendall(http_request("GET", "/health"))
    assert read_response(s)[0] == 200
    s.settimeout(5)
    t0 = time.time()
    assert s.recv(1) == b""  # closed by the server
    assert 1.5 < time.time() - t0 < 4


def test_pipelined_requests(server):
    s = connect(server)
    s.sendall(http_request("GET", "/health") + http_request("GET", "/version") + http_request("GET", "/health"))
    pending = bytearray()
    assert read_response(s, pending=pending)[0] == 200
    status, _, body = read_response(s, pending=pending)
    assert status == 200 and "version" in json.loads(body)
    assert read_response(s, pending=pending)[0] == 200


def test_expect_100_continue(server):
    s = connect(server)
    body = completion_body()
    s.sendall(http_request("POST", "/v1/completions", b"", ["Content-Type: application/json",
                                                             f"Content-Length: {len(body)}", "Expect: 100-continue"]))
    s.settimeout(5)
    assert s.recv(64).startswith(b"HTTP/1.1 100 Continue")
    s.sendall(body)
    status, _, reply = read_response(s)
    assert status == 200


def test_server_back_to_idle_with_no_leak(server):
    assert wait_idle(server) < 5
    assert healthy(server)


def test_connection_cap_gives_503():
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    s = Server(["--max-connections", "20", "--timeout-keep-alive", "30", "--header-timeout", "30"]).start()
    try:
        held = [connect(s) for _ in range(20)]
        time.sleep(0.3)
        extra = connect(s)
        extra.sendall(http_request("GET", "/health"))
        status, _, body = read_response(extra)
        assert status == 503
        assert "too many connections (the limit is 20)" in json.loads(body)["error"]["message"]
        for c in held:
            c.close()
        time.sleep(0.3)
        assert requests.get(s.url("/health"), timeout=5).status_code == 200
    finally:
        assert s.stop() == 0, s.output()


def test_api_key_checked_before_the_body_is_read():
    """Without the key the head alone gets 401: the body (here never sent,
    and a gzip bomb in the other case) is not read or inflated."""
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    s = Server(["--api-key", "sekrit"]).start()
    try:
        c = connect(s)
        c.sendall(http_request("POST", "/v1/completions", b"", ["Content-Length: 900000",
                                                                 "Content-Type: application/json"]))
        status, _, body = read_response(c, timeout=5)
        assert status == 401
        before = s.rss_bytes()
        bomb = gzip.compress(b"\0" * (1 << 30), compresslevel=9)
        r = requests.post(s.url("/v1/completions"), data=bomb, timeout=60,
                          headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 401
        assert s.rss_bytes() - before < 32 << 20
        r = requests.get(s.url("/health"), timeout=5)
        assert r.status_code == 200
    finally:
        assert s.stop() == 0, s.output()
