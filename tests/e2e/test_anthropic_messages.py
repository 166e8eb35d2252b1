"""POST /v1/messages through the official `anthropic` client: plain, with
stop_sequences, streamed (raw events and the client's stream helper), a
tool_use -> tool_result round trip, thinking blocks, the API key in
x-api-key, and errors in Anthropic's shape naming the field. The requests run
through the chat pipeline, so greedy output equals /v1/chat/completions' for
the same messages."""

import json

import anthropic
import jsonschema
import pydantic
import pytest
import requests

from conftest import STORIES
from dialects import MODEL, WEATHER_SCHEMA, chat_text, sse_events, start_server

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER_SCHEMA}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# This client has no sampling arguments (the newest models fix them); the server reads them.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server():
    if not STORIES.exists():
        pytest.skip("missing test data")
    s = start_server(["--api-key", KEY])
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=120)


def test_plain_message_equals_chat_completions(server, client):
    m = client.messages.create(model=MODEL, max_tokens=20, extra_body=GREEDY, system="You tell stories.",
                               messages=[{"role": "user", "content": "Tell me a story."}])
    assert isinstance(m, anthropic.types.Message) and m.type == "message" and m.role == "assistant"
    assert m.id.startswith("msg_") and m.stop_reason == "max_tokens" and m.stop_sequence is None
    (block,) = m.content
    text, usage = chat_text(server, [{"role": "system", "content": "You tell stories."},
                                     {"role": "user", "content": "Tell me a story."}],
                            headers=AUTH, max_tokens=20, temperature=0)
    assert block.type == "text" and block.text == text and text
    assert m.usage.output_tokens == 20
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == usage["prompt_tokens"]

    # system as text blocks, content as blocks: the same prompt
    m2 = client.messages.create(model=MODEL, max_tokens=20, extra_body=GREEDY,
                                system=[{"type": "text", "text": "You tell stories."}],
                                messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me a story."}]}])
    assert m2.content[0].text == text


def test_stop_sequences(client):
    kw = dict(model=MODEL, max_tokens=40, extra_body=GREEDY, messages=[{"role": "user", "content": "Once upon a time"}])
    text = client.messages.create(**kw).content[0].text
    word = text.split()[3]
    m = client.messages.create(stop_sequences=[word], **kw)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == text[:text.index(word)]


def test_streaming(server, client):
    kw = dict(model=MODEL, max_tokens=16, extra_body=GREEDY, messages=[{"role": "user", "content": "Once upon a time"}])
    events = list(client.messages.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[:2] == ["message_start", "content_block_start"]
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(types[2:-3]) == {"content_block_delta"}
    assert events[0].message.usage.input_tokens > 0
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 16
    streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert streamed == client.messages.create(**kw).content[0].text

    with client.messages.stream(**kw) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == final.content[0].text == streamed and final.stop_reason == "max_tokens"

    # the raw wire: "event:" lines name each event
    r = requests.post(server.url("/v1/messages"), headers={"x-api-key": KEY}, stream=True, timeout=60,
                      json={**kw, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert all(event == data["type"] for event, data in sse_events(r))


def test_tool_use_round_trip(client):
    m = client.messages.create(model=MODEL, max_tokens=200, messages=ASK, tools=[WEATHER], extra_body=GREEDY,
                               tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use"
    (use,) = m.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER_SCHEMA)

    history = [*ASK, {"role": "assistant", "content": m.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    answer = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"})
    assert answer.content[0].type == "text" and answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.usage.input_tokens > m.usage.input_tokens

    # streamed: the arguments arrive as input_json_delta; the client assembles the input
    # (tool_choice any: a list of calls, one at most here)
    with client.messages.stream(model=MODEL, max_tokens=150, messages=ASK, tools=[WEATHER], extra_body=GREEDY,
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    (use,) = final.content
    assert use.type == "tool_use" and final.stop_reason == "tool_use"
    jsonschema.validate(use.input, WEATHER_SCHEMA)


def test_thinking_blocks(client):
    kw = dict(model=MODEL, max_tokens=12, extra_body=GREEDY, messages=[{"role": "user", "content": "Think."}],
              thinking={"type": "enabled", "budget_tokens": 1024})
    m = client.messages.create(**kw)
    assert m.content[0].type == "thinking" and m.content[0].thinking
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == m.content[0].thinking


def test_api_key(server):
    bad = anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model=MODEL, max_tokens=2, messages=ASK)
    body = {"model": MODEL, "max_tokens": 2, "messages": ASK}
    assert requests.post(server.url("/v1/messages"), json=body, timeout=30).status_code == 401
    assert requests.post(server.url("/v1/messages"), json=body, headers=AUTH, timeout=30).status_code == 200
    # the OpenAI routes take Anthropic's header too
    assert requests.get(server.url("/v1/models"), headers={"x-api-key": KEY}, timeout=30).status_code == 200


@pytest.mark.parametrize("body, words", [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 0, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "robot"),
    ({"max_tokens": 5, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"max_tokens": 5, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "x"}}, "'x'"),
    ({"max_tokens": 5, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "web_search_20250305"),
    ({"max_tokens": 5, "messages": ASK, "stop_sequences": "."}, "stop_sequences"),
])
def test_errors_in_anthropic_shape(server, client, body, words):
    r = requests.post(server.url("/v1/messages"), headers={"x-api-key": KEY}, json={"model": MODEL, **body},
                      timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert words in r.json()["error"]["message"]
    if "max_tokens" not in body:
        return  # the client requires it itself
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, **body)
    assert e.value.body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [
    {"max_tokens": 5, "messages": ASK},
    {"max_tokens": 200, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "any"}, "temperature": 0},
    {"max_tokens": 5, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 1024}},
])
def test_every_event_validates_against_the_clients_types(server, body):
    """Strict pydantic validation (required fields, literal values), not the client's lenient construction."""
    events = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
    r = requests.post(server.url("/v1/messages"), headers={"x-api-key": KEY}, json={"model": MODEL, **body,
                                                                                    "stream": True},
                      stream=True, timeout=60)
    seen = []
    for event, data in sse_events(r):
        seen.append(event)
        if event == "ping":  # Anthropic's keep-alive: not in the event union, the client skips it
            assert data == {"type": "ping"}
            continue
        assert events.validate_python(data).type == event
    assert seen[:2] == ["message_start", "ping"]
    anthropic.types.Message.model_validate(
        requests.post(server.url("/v1/messages"), headers={"x-api-key": KEY}, json={"model": MODEL, **body},
                      timeout=60).json())


def test_count_tokens_equals_the_prompt_of_a_message(client):
    for kw in (dict(messages=ASK), dict(messages=ASK, system="Be brief."),
               dict(messages=ASK, tools=[WEATHER], tool_choice={"type": "any"})):
        counted = client.messages.count_tokens(model=MODEL, **kw).input_tokens
        made = client.messages.create(model=MODEL, max_tokens=1, extra_body=GREEDY, **kw)
        # Anthropic counts prompt tokens read from the cache apart from input_tokens
        assert counted == made.usage.input_tokens + made.usage.cache_read_input_tokens > 0
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.count_tokens(model=MODEL, messages=[])
    assert e.value.body["type"] == "error" and "messages" in e.value.message
