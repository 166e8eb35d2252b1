"""Server life cycle on stories260K: a client that disconnects aborts its
request (KV blocks back to the pool), a full queue answers 503, API keys
(401), body size limit (413), graceful shutdown on SIGTERM (exit 0)."""

import json
import signal
import socket
import subprocess
import threading
import time

import pytest
import requests

import prom
from conftest import STORIES, Server, openai_client

LONG = {"prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True, "temperature": 0}


def metrics(server):
    return prom.parse(requests.get(server.url("/metrics"), timeout=10).text)


def aborted(server):
    return prom.value(metrics(server), "pagellm:request_success_total", finished_reason="abort")


def wait_idle(server, timeout=10):
    """Until nothing runs and no KV block is in use; returns the metrics."""
    deadline = time.time() + timeout
    while True:
        m = metrics(server)
        busy = (prom.value(m, "pagellm:num_requests_running"), prom.value(m, "pagellm:num_requests_waiting"),
                prom.value(m, "pagellm:kv_blocks_used"))
        if busy == (0, 0, 0):
            return m
        if time.time() > deadline:
            raise AssertionError(f"still busy after {timeout} s: running, waiting, used blocks = {busy}")
        time.sleep(0.05)


def raw_request(server, body, path="/v1/completions"):
    """A raw HTTP request on a socket we can close whenever we like."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


@pytest.fixture(scope="module")
def server():
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    s = Server(["--max-num-seqs", "8"]).start()
    yield s
    assert s.stop() == 0, s.output()


def test_stream_disconnect_aborts(server):
    before = aborted(server)
    s = raw_request(server, {**LONG, "stream": True, "n": 2})
    received = b""
    while received.count(b"data: ") < 4:
        chunk = s.recv(4096)
        assert chunk, "server closed early"
        received += chunk
    s.close()
    deadline = time.time() + 10
    while aborted(server) < before + 1:
        assert time.time() < deadline, "the disconnected stream was not aborted"
        time.sleep(0.02)
    wait_idle(server)


def test_non_stream_disconnect_aborts(server):
    before = aborted(server)
    s = raw_request(server, {**LONG, "n": 8})
    time.sleep(0.05)
    s.close()
    deadline = time.time() + 10
    while aborted(server) < before + 1:
        assert time.time() < deadline, "the disconnected request was not aborted"
        time.sleep(0.02)
    wait_idle(server)


def test_server_still_serves_after_disconnects(server):
    r = requests.post(server.url("/v1/completions"), json={"prompt": "Hello", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200


def test_queue_full_503():
    s = Server(["--max-num-seqs", "1", "--max-waiting-requests", "1"]).start()
    try:
        statuses = []
        lock = threading.Lock()

        def one():
            r = requests.post(s.url("/v1/completions"), json={**LONG, "max_tokens": 400}, timeout=60)
            with lock:
                statuses.append((r.status_code, r.json()))

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        codes = sorted(c for c, _ in statuses)
        assert codes.count(200) >= 1 and codes.count(503) >= 1, codes
        for code, body in statuses:
            if code == 503:
                assert body["error"]["type"] == "server_error" and body["error"]["code"] == "overloaded"
        wait_idle(s)
    finally:
        assert s.stop() == 0, s.output()


def test_api_key_and_body_limit():
    s = Server(["--api-key", "sekret", "--max-request-bytes", "4KiB"]).start()
    try:
        body = {"prompt": "Hello", "max_tokens": 2}
        url = s.url("/v1/completions")
        r = requests.post(url, json=body, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = requests.post(url, json=body, headers={"Authorization": "Bearer wrong"}, timeout=10)
        assert r.status_code == 401
        r = requests.post(url, json=body, headers={"Authorization": "Bearer sekret"}, timeout=10)
        assert r.status_code == 200
        assert requests.get(s.url("/v1/models"), timeout=10).status_code == 401
        assert requests.post(s.url("/tokenize"), json={"prompt": "x"}, timeout=10).status_code == 401
        # Probes and scrapers need no key.
        assert requests.get(s.url("/health"), timeout=10).status_code == 200
        assert requests.get(s.url("/metrics"), timeout=10).status_code == 200
        # The openai client sends the key.
        c = openai_client(s, api_key="sekret").completions.create(model="stories260K", prompt="Hi", max_tokens=2)
        assert c.usage.completion_tokens == 2
        # 413 for a body over the limit (checked before the key).
        big = {"prompt": "x" * 5000, "max_tokens": 2}
        r = requests.post(url, json=big, headers={"Authorization": "Bearer sekret"}, timeout=10)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    finally:
        assert s.stop() == 0, s.output()


def read_sse(sock, buf=b""):
    """Yields each SSE data payload from a raw chunked HTTP response."""
    while True:
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            line = event.split(b"data: ", 1)
            if len(line) == 2:
                yield line[1].split(b"\r\n")[0]
        data = sock.recv(65536)
        if not data:
            return
        buf += data


def after_sigterm_request(s):
    """A new request after SIGTERM: 503 while draining, or refused once closed."""
    try:
        r = requests.post(s.url("/v1/completions"), json={"prompt": "Hi", "max_tokens": 2}, timeout=10)
        return r.status_code
    except requests.ConnectionError:
        return "refused"


@pytest.mark.parametrize("grace,expect_finish", [(30, "length"), (0, "abort")])
def test_graceful_shutdown(grace, expect_finish):
    s = Server(["--shutdown-timeout", str(grace)]).start()
    try:
        sock = raw_request(s, {**LONG, "max_tokens": 500 if grace else 500, "stream": True})
        events = read_sse(sock)
        first = next(events)
        assert json.loads(first)["choices"]
        s.signal(signal.SIGTERM)
        # Signals are asynchronous: wait until the server says it took it.
        deadline = time.time() + 10
        while "shutting down" not in s.output():
            assert time.time() < deadline, s.output()
            time.sleep(0.01)
        status = after_sigterm_request(s)
        assert status in (503, "refused"), status
        finish = None
        rest = list(events)
        for e in rest:
            if e != b"[DONE]" and b'"choices"' in e:
                for ch in json.loads(e)["choices"]:
                    finish = ch["finish_reason"] or finish
        sock.close()
        assert finish == expect_finish, rest[-3:]
        assert rest[-1] == b"[DONE]"
        assert s.proc.wait(30) == 0, s.output()
        assert "shutdown complete" in s.output()
    finally:
        s.kill()


def test_port_in_use_is_an_error(server):
    """A second server on a port that is listening exits with a clear error
    instead of sharing it (SO_REUSEPORT would let the kernel split clients
    between the two)."""
    second = Server(port=server.port)
    r = subprocess.run(second.cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "address in use" in r.stderr + r.stdout
    assert requests.get(server.url("/health"), timeout=10).status_code == 200
