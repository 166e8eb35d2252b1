"""Structured outputs under hostile input, over real HTTP on stories260K:
limits that hold however a schema arrives (object or JSON text), compiles
that stop at their budget or when their client leaves, while other requests
are served; constraints whose language is empty are 400s; RSS stays flat over
rounds of distinct schemas; SIGTERM ends the server with a compile running."""

import json
import signal
import socket
import threading
import time

import pytest
import requests

import prom
from conftest import STORIES, Server

PROMPT = "Once upon a time"


def deep_arrays(n):
    return '{"type":"array","items":' * n + '{"type":"integer"}' + "}" * n


def required_props(n, prefix="p"):
    """n required properties: a compile of seconds on any vocabulary."""
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "integer"} for i in range(n)},
            "required": [f"{prefix}{i}" for i in range(n)]}


def post(server, body, chat=False, timeout=60, stream=False):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return requests.post(server.url(path), json=body, timeout=timeout, stream=stream)


def completion(**fields):
    return {"prompt": PROMPT, "max_tokens": 8, **fields}


def check_400(r, param, *contains):
    assert r.status_code == 400, (r.status_code, r.text[:500])
    e = r.json()["error"]
    assert e["type"] == "invalid_request_error" and e["param"] == param, e
    for c in contains:
        assert c in e["message"], e["message"]


def check_served(server):
    """A plain request and a small constrained one both complete."""
    r = post(server, completion())
    assert r.status_code == 200, r.text
    r = post(server, completion(structured_outputs={"choice": ["yes", "no"]}))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("yes", "no")


def metrics(server):
    return prom.parse(requests.get(server.url("/metrics"), timeout=10).text)


def metric(server, name):
    return prom.value(metrics(server), "pagellm:" + name)


def rss_mb(server):
    return server.rss_bytes() / 2**20


@pytest.fixture(scope="module")
def server():
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    # Small limits and a 1 s compile budget keep every case fast.
    s = Server(["--grammar-max-depth", "16", "--grammar-max-nodes", "2000", "--grammar-max-bytes", "32KiB",
                "--grammar-compile-timeout", "1", "--grammar-compile-workers", "2",
                "--shutdown-timeout", "2"]).start()
    yield s
    assert s.stop() == 0, s.output()


# --- 1. limits, however the spec arrives ---------------------------------------

@pytest.mark.parametrize("where,param", [
    ("structured_outputs", "structured_outputs"),
    ("guided_json", "guided_json"),
    ("response_format", "response_format"),
])
def test_a_deep_schema_as_text_is_a_quick_400(server, where, param):
    schema = deep_arrays(5000)  # the issue's reproduction
    body = {"structured_outputs": {"json": schema}} if where == "structured_outputs" else \
        {"guided_json": schema} if where == "guided_json" else \
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    t0 = time.time()
    r = post(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **body}, chat=True)
    check_400(r, param, "--grammar-max-bytes")
    assert time.time() - t0 < 2
    check_400(post(server, completion(guided_json=deep_arrays(20))), "guided_json", "21 levels", "--grammar-max-depth")
    check_served(server)


@pytest.mark.parametrize("field,value,limit", [
    ("guided_json", json.dumps({"enum": list(range(5000))}), "--grammar-max-nodes"),
    ("guided_regex", "|".join(f"w{i}" for i in range(3000)), "--grammar-max-nodes"),
    ("guided_regex", "(a{1000}){1000}", "--grammar-max-nodes"),
    ("guided_choice", [f"c{i}" for i in range(3000)], "--grammar-max-nodes"),
    ("guided_grammar", "root ::= r0\n" + "\n".join(f'r{i} ::= "x" | r{i + 1}' for i in range(800)) + '\nr800 ::= "y"',
     "--grammar-max-nodes"),
    ("guided_json", json.dumps({"type": "object", "properties": {"a" * 40000: {"type": "string"}}}),
     "--grammar-max-bytes"),
])
def test_every_kind_has_its_limits(server, field, value, limit):
    check_400(post(server, completion(**{field: value})), field, limit)


def test_tool_schemas_have_the_same_limits(server):
    tool = {"type": "function", "function": {"name": "f", "parameters": json.loads(deep_arrays(20))}}
    r = post(server, {"messages": [{"role": "user", "content": "hi"}], "tools": [tool], "tool_choice": "required"},
             chat=True)
    check_400(r, "tools", "--grammar-max-depth")


# --- 1. compile budget, cancellation, metrics -----------------------------------

def test_a_slow_compile_stops_at_its_budget_while_others_are_served(server):
    before = metric(server, "structured_output_compile_over_budget_total")
    result = {}

    def slow():
        result["r"] = post(server, completion(guided_json=required_props(400)))

    t = threading.Thread(target=slow)
    t.start()
    deadline = time.time() + 10
    seen_in_progress = seen_waiting = False
    while t.is_alive() and time.time() < deadline:
        m = metrics(server)
        seen_in_progress |= prom.value(m, "pagellm:structured_output_compiles_in_progress") >= 1
        seen_waiting |= prom.value(m, "pagellm:num_requests_waiting") >= 1
        if seen_in_progress and seen_waiting:
            break
        time.sleep(0.02)
    check_served(server)  # during the compile: the second worker and the engine serve others
    t.join(30)
    check_400(result["r"], "guided_json", "--grammar-compile-timeout")
    assert seen_in_progress and seen_waiting
    assert metric(server, "structured_output_compile_over_budget_total") == before + 1
    m = metrics(server)
    assert prom.value(m, "pagellm:structured_output_compiles_in_progress") == 0
    assert prom.value(m, "pagellm:num_requests_waiting") == 0
    assert prom.value(m, "pagellm:structured_output_compile_time_seconds",
                      "pagellm:structured_output_compile_time_seconds_count") >= 1


def test_the_streamed_form_of_a_failed_compile_is_a_400_status(server):
    r = post(server, completion(guided_regex="[^\\s\\S]", stream=True), stream=True)
    check_400(r, "guided_regex", "admits no output")


def test_a_compile_whose_client_left_is_cancelled():
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    # A budget far beyond the test: only the client's leaving can end the compile.
    s = Server(["--grammar-compile-timeout", "60", "--grammar-max-nodes", "100000", "--grammar-max-bytes", "1MiB"])
    s.start()
    try:
        body = json.dumps(completion(guided_json=required_props(1500))).encode()
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            deadline = time.time() + 10
            while metric(s, "structured_output_compiles_in_progress") < 1 and time.time() < deadline:
                time.sleep(0.02)
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        t0 = time.time()
        while metric(s, "structured_output_compile_cancelled_total") < 1 and time.time() < t0 + 3:
            time.sleep(0.05)
        assert metric(s, "structured_output_compile_cancelled_total") == 1
        assert metric(s, "structured_output_compiles_in_progress") == 0
        assert metric(s, "num_requests_waiting") == 0
        check_served(s)
        assert s.stop() == 0, s.output()
    finally:
        s.kill()


# --- 2. empty languages and what the engine cannot enforce ------------------------

@pytest.mark.parametrize("field,value,contains", [
    ("guided_regex", "[^\\s\\S]", "admits no output"),
    ("guided_grammar", 'root ::= root "a"', "admits no output"),
    ("guided_grammar", "root ::= x\nx ::= x", "admits no output"),
    ("guided_json", {"anyOf": []}, "'anyOf' (at #) is empty"),
    ("guided_json", {"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]}, "'enum'"),
    ("guided_json", {"allOf": [{"type": "string"}, {"type": "integer"}]}, "'allOf'"),
    ("guided_json", {"$ref": "https://example.com/schema.json"}, "outside the schema"),
])
def test_constraints_that_admit_nothing_are_400s(server, field, value, contains):
    check_400(post(server, completion(**{field: value})), field, contains)


@pytest.mark.parametrize("stream", [False, True])
def test_a_grammar_that_dead_ends_later_fails_only_its_request(server, stream):
    # "Once" is allowed; after it nothing is: no stop token, no character.
    r = post(server, completion(guided_grammar='root ::= "Once" [^\\x00-\\U0010FFFF]', stream=stream), stream=stream)
    if r.status_code == 400:  # before any token was sent (always, unstreamed)
        check_400(r, "guided_grammar", "allows no further token")
    else:  # a stream that had begun ends with the error event
        assert r.status_code == 200 and stream, r.text
        assert '"param":"guided_grammar"' in r.text and "allows no further token" in r.text, r.text
    check_served(server)


@pytest.mark.parametrize("field,value", [("guided_choice", [""]), ("guided_grammar", 'root ::= ""')])
def test_the_empty_string_alone_gives_empty_content(server, field, value):
    r = post(server, completion(**{field: value}))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == ""
    assert r.json()["choices"][0]["finish_reason"] == "stop"


# --- 5. memory stays flat over rounds of distinct schemas --------------------------

def test_rss_stays_flat_over_rounds_of_distinct_schemas(server):
    def round_of(k):
        for i in range(24):  # more distinct schemas than the cache holds (64): evictions every round
            schema = {"type": "object", "properties": {f"k{k}_{i}_{j}": {"type": "integer"} for j in range(4)}}
            assert post(server, completion(guided_json=schema, max_tokens=2)).status_code == 200

    round_of(0)
    round_of(1)
    first = rss_mb(server)
    sizes = []
    for k in range(2, 10):
        round_of(k)
        sizes.append(rss_mb(server))
    assert max(sizes) < first * 1.10 + 8, (first, sizes)


# --- SIGTERM with a compile in progress ------------------------------------------

def test_sigterm_ends_the_server_with_a_compile_in_progress():
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    s = Server(["--grammar-compile-timeout", "60", "--grammar-max-nodes", "100000", "--grammar-max-bytes", "1MiB",
                "--shutdown-timeout", "1"]).start()
    try:
        threading.Thread(target=lambda: post(s, completion(guided_json=required_props(1500)), timeout=30),
                         daemon=True).start()
        deadline = time.time() + 10
        while metric(s, "structured_output_compiles_in_progress") < 1 and time.time() < deadline:
            time.sleep(0.02)
        t0 = time.time()
        s.signal(signal.SIGTERM)
        code = s.proc.wait(20)
        assert time.time() - t0 < 1 + 5 + 2, s.output()
        assert code == 0, s.output()
    finally:
        s.kill()
