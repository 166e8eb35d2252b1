"""POST /v1/responses through the official `openai` client: plain and streamed
(the client's own types and its stream helper read every event), function
tools with a round trip by previous_response_id and by full input, reasoning
items, text.format, the response store, and 400s naming the field. The
requests run through the chat pipeline, so greedy output equals
/v1/chat/completions' for the same messages."""

import json
import socket
import time

import jsonschema
import openai
import pydantic
import pytest
import requests
from openai.types import responses as rtypes

import prom
from conftest import STORIES, openai_client
from dialects import MODEL, WEATHER_SCHEMA, chat_text, sse_events, start_server

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": WEATHER_SCHEMA}
FORCE_WEATHER = {"type": "function", "name": "get_weather"}


@pytest.fixture(scope="module")
def server():
    if not STORIES.exists():
        pytest.skip("missing test data")
    s = start_server()
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_plain_response_equals_chat_completions(server, client):
    r = client.responses.create(model=MODEL, input="Tell me a story.", instructions="You tell stories.",
                                max_output_tokens=24, temperature=0)
    assert isinstance(r, rtypes.Response) and r.id.startswith("resp_") and r.object == "response"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    text, usage = chat_text(server, [{"role": "system", "content": "You tell stories."},
                                     {"role": "user", "content": "Tell me a story."}],
                            max_tokens=24, temperature=0)
    assert r.output_text == text and text
    assert r.usage.input_tokens == usage["prompt_tokens"] and r.usage.output_tokens == 24
    assert r.usage.total_tokens == r.usage.input_tokens + 24
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r.instructions == "You tell stories." and r.max_output_tokens == 24

    # The same conversation as message items with content parts, "developer" as the system role.
    r2 = client.responses.create(model=MODEL, max_output_tokens=24, temperature=0, input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You tell stories."}]},
        {"role": "user", "content": "Tell me a story."}])
    assert r2.output_text == text


def test_streamed_events_parse_and_add_up(client):
    kw = dict(model=MODEL, input="Once upon a time", max_output_tokens=16, temperature=0)
    events = list(client.responses.create(stream=True, **kw))
    assert all(not isinstance(e, dict) for e in events)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == deltas == client.responses.create(**kw).output_text
    assert final.usage.output_tokens == 16
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}

    # The client's stream helper keeps its own state from the events (its
    # final response needs response.completed: a stop string ends this one).
    kw.update(max_output_tokens=64, extra_body={"stop": ["."]})
    with client.responses.stream(**kw) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output[0].status == "completed"
    assert final.output_text == "".join(texts) == client.responses.create(**kw).output_text


def check_call(item):
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    jsonschema.validate(json.loads(item.arguments), WEATHER_SCHEMA)


def test_function_tool_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model=MODEL, input=ask, tools=[WEATHER], tool_choice=FORCE_WEATHER,
                                max_output_tokens=200, temperature=0)
    assert r.status == "completed"
    (call,) = r.output
    check_call(call)
    assert r.tools[0].name == "get_weather"

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    by_id = client.responses.create(model=MODEL, previous_response_id=r.id, input=[result], tools=[WEATHER],
                                    tool_choice="none", max_output_tokens=8, temperature=0)
    assert by_id.previous_response_id == r.id and by_id.output[0].type == "message"
    # The whole conversation given again renders the same prompt.
    full = client.responses.create(model=MODEL, input=[*ask, call.model_dump(), result], tools=[WEATHER],
                                   tool_choice="none", max_output_tokens=8, temperature=0, store=False)
    assert full.usage.input_tokens == by_id.usage.input_tokens > r.usage.input_tokens
    assert full.output_text == by_id.output_text


def test_streamed_function_call(client):
    with client.responses.stream(model=MODEL, input="Weather in Oslo?", tools=[WEATHER], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=200, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    (call,) = final.output
    check_call(call)
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments


def test_reasoning_items(client):
    think = {"chat_template_kwargs": {"enable_thinking": True}}
    r = client.responses.create(model=MODEL, input="Think.", max_output_tokens=12, temperature=0, extra_body=think)
    assert r.output[0].type == "reasoning" and r.output[0].id.startswith("rs_")
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text
    events = list(client.responses.create(model=MODEL, input="Think.", max_output_tokens=12, temperature=0,
                                          extra_body=think, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == r.output[0].content[0].text


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"],
              "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="A name as JSON.", max_output_tokens=40, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"

    # The client's parse() with a pydantic model sends the same kind of format.
    class Pet(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=8)
        legs: int = pydantic.Field(ge=0, le=9)

    parsed = client.responses.parse(model=MODEL, input="A pet as JSON.", max_output_tokens=120, temperature=0,
                                    text_format=Pet)
    assert isinstance(parsed.output_parsed, Pet)


def test_store(client):
    unstored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    for missing in (unstored.id, "resp_unknown"):
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, previous_response_id=missing)
        assert missing in e.value.message and e.value.body["param"] == "previous_response_id"
    # instructions are not carried over (as OpenAI's)
    first = client.responses.create(model=MODEL, input="Hi", instructions="Be brief.", max_output_tokens=2)
    second = client.responses.create(model=MODEL, input="Again", previous_response_id=first.id, max_output_tokens=2)
    assert second.instructions is None and second.previous_response_id == first.id
    # stored responses can be fetched again, streamed ones too
    assert client.responses.retrieve(second.id) == second
    streamed = list(client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, stream=True))[-1].response
    assert client.responses.retrieve(streamed.id) == streamed
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_input_items_and_delete(client):
    calls = [{"type": "message", "role": "user", "content": "What is the weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    r = client.responses.create(model=MODEL, input=calls, max_output_tokens=2, tools=[WEATHER])
    items = client.responses.input_items.list(r.id)  # newest first, as OpenAI lists them
    assert [i.type for i in items.data] == ["function_call_output", "function_call", "message"]
    assert items.data[2].content[0].type == "input_text"
    assert items.data[2].content[0].text == "What is the weather in Paris?"
    assert items.data[1].name == "get_weather" and items.data[0].output == "sunny"
    assert len({i.id for i in items.data}) == 3 and not items.has_more
    page = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.type for i in page.data] == ["message", "function_call"] and page.has_more
    rest = client.responses.input_items.list(r.id, order="asc", after=page.data[-1].id)
    assert [i.type for i in rest.data] == ["function_call_output"]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.input_items.list(r.id, limit=0)
    assert e.value.body["param"] == "limit"

    client.responses.delete(r.id)
    for gone in (lambda: client.responses.retrieve(r.id), lambda: client.responses.delete(r.id),
                 lambda: client.responses.input_items.list(r.id)):
        with pytest.raises(openai.NotFoundError):
            gone()
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, previous_response_id=r.id)


@pytest.mark.parametrize("body, param, words", [
    ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input", "image_generation_call"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "input_image"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "web_search"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice", "file_search"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format", "yaml"),
    ({}, "input", "input"),
    ({"input": 5}, "input", "input"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param, words):
    r = requests.post(server.url("/v1/responses"), json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"] and err["type"] == "invalid_request_error"


def test_a_client_that_leaves_aborts_its_request(server):
    """A stream whose client hangs up is aborted (the chat pipeline's disconnect handling)."""
    def aborted():
        m = prom.parse(requests.get(server.url("/metrics"), timeout=10).text)
        return prom.value(m, "pagellm:request_success_total", finished_reason="abort")

    before = aborted()
    body = json.dumps({"model": MODEL, "input": "Once upon a time", "max_output_tokens": 480, "ignore_eos": True,
                       "temperature": 0, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while received.count(b"response.output_text.delta") < 3:
        chunk = s.recv(4096)
        assert chunk, "server closed early"
        received += chunk
    s.close()
    deadline = time.time() + 10
    while aborted() < before + 1:
        assert time.time() < deadline, "the disconnected stream was not aborted"
        time.sleep(0.02)


@pytest.mark.parametrize("body", [
    {"input": "Hi", "max_output_tokens": 5},
    {"input": "Hi", "max_output_tokens": 300, "stop": ["."]},
    {"input": "Hi", "tools": [WEATHER], "tool_choice": "required", "max_output_tokens": 200, "temperature": 0},
    {"input": "Hi", "max_output_tokens": 5, "chat_template_kwargs": {"enable_thinking": True}},
])
def test_every_event_validates_against_the_clients_types(server, body):
    """Strict pydantic validation (required fields, literal values), not the client's lenient construction."""
    events = pydantic.TypeAdapter(rtypes.ResponseStreamEvent)
    r = requests.post(server.url("/v1/responses"), json={"model": MODEL, **body, "stream": True}, stream=True,
                      timeout=60)
    for event, data in sse_events(r):
        assert events.validate_python(data).type == event
    rtypes.Response.model_validate(requests.post(server.url("/v1/responses"), json={"model": MODEL, **body},
                                                 timeout=60).json())
