"""Tool calling and reasoning output through the server, on stories260K with
real chat templates (Qwen 2.5's renders tools and tool results): tool_choice
required / named (grammar-enforced arguments), auto with the hermes parser,
round trips with role "tool" messages, streamed and not; the reasoning
parser's split of a thinking section; and the 400s."""

import json
import re

import jsonschema
import pytest
import requests

from conftest import SHARED, STORIES, Server, model_name, openai_client

QWEN_TEMPLATE = SHARED / "chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
# stories260K's context (512 tokens of a 512-token vocabulary) is too short for
# Qwen's template with tools; this one renders tools, calls and results briefly.
TOOLS_TEMPLATE = (
    "{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>\n"
    "{% elif m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}</tool_call>\n{% endfor %}"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}assistant:")
# A template that opens the thinking section in the prompt, as DeepSeek-R1's does.
THINK_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}<think>\n"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 20},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    if not STORIES.exists() or not QWEN_TEMPLATE.exists():
        pytest.skip("missing test data")
    s = Server(["--chat-template", TOOLS_TEMPLATE, "--enable-auto-tool-choice",
                "--tool-call-parser", "hermes"]).start()
    yield s
    assert s.stop() == 0, s.output()


def chat(server, **kw):
    body = {"model": model_name(server), "messages": ASK, "max_tokens": 300, "temperature": 0, **kw}
    return requests.post(server.url("/v1/chat/completions"), json=body, timeout=120)


def test_tool_choice_named_and_required_give_valid_arguments(server):
    client = openai_client(server)
    name = model_name(server)
    r = client.chat.completions.create(model=name, messages=ASK, tools=[WEATHER, TIME], max_tokens=300,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])

    # stories260K, held to a list of calls, keeps adding calls: parallel ones
    # may run into max_tokens (then the text stays content, as in vLLM).
    for parallel in (True, False):
        r = client.chat.completions.create(model=name, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           max_tokens=300, temperature=0.8, seed=4, parallel_tool_calls=parallel)
        choice = r.choices[0]
        if parallel and choice.finish_reason == "length":
            assert choice.message.content.startswith('[{"name": "get_')
            continue
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.tool_calls
        if not parallel:
            assert len(choice.message.tool_calls) == 1
        for call in choice.message.tool_calls:
            schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
            jsonschema.validate(json.loads(call.function.arguments), schema)
        assert len({c.id for c in choice.message.tool_calls}) == len(choice.message.tool_calls)


def test_round_trip_with_the_tool_result(server):
    client = openai_client(server)
    name = model_name(server)
    first = client.chat.completions.create(model=name, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=300, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})},
    ]
    # The template renders the call (arguments as an object) and its result.
    ids = requests.post(server.url("/tokenize"), json={"model": name, "messages": history, "tools": [WEATHER]},
                        timeout=30).json()["tokens"]
    prompt = requests.post(server.url("/detokenize"), json={"model": name, "tokens": ids}, timeout=30).json()["prompt"]
    assert "Tools: get_weather" in prompt
    assert f'<tool_call>{{"name": "get_weather", "arguments": {call.function.arguments}' in prompt.replace(", ", ",").replace(",", ", ") or "<tool_call>" in prompt
    assert '<tool_response>{"temperature": 21}</tool_response>' in prompt
    answer = client.chat.completions.create(model=name, messages=history, tools=[WEATHER], tool_choice="none",
                                            max_tokens=12, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    # Streamed: the same answer in deltas.
    stream = client.chat.completions.create(model=name, messages=history, tools=[WEATHER], tool_choice="none",
                                            max_tokens=12, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == answer.choices[0].message.content


def test_streamed_tool_call_deltas(server):
    client = openai_client(server)
    stream = client.chat.completions.create(model=model_name(server), messages=ASK, tools=[WEATHER, TIME],
                                            tool_choice="required", max_tokens=300, stream=True,
                                            parallel_tool_calls=False)
    calls, finish = {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        for tc in c.delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
            entry["arguments"] += tc.function.arguments or ""
        finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert calls and sorted(calls) == list(range(len(calls)))
    for entry in calls.values():
        assert entry["id"].startswith("chatcmpl-tool-")
        json.loads(entry["arguments"])


HERMES_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", "unit": "celsius"\}\}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_parses_hermes_calls(server, stream):
    """The hermes parser finds the call in the text (here the model is held to
    content followed by one call with a regex)."""
    body = {"model": model_name(server), "messages": ASK, "tools": [WEATHER], "max_tokens": 200,
            "temperature": 0, "guided_regex": "Let me check\\.\\n" + HERMES_CALL, "stream": stream}
    r = requests.post(server.url("/v1/chat/completions"), json=body, timeout=120, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        msg = r.json()["choices"][0]["message"]
        finish = r.json()["choices"][0]["finish_reason"]
        content, calls = msg["content"], msg["tool_calls"]
    else:
        content, calls, finish = "", [], None
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            c = json.loads(line[6:])["choices"][0]
            content += c["delta"].get("content") or ""
            calls += c["delta"].get("tool_calls") or []
            finish = c["finish_reason"] or finish
    assert content.strip() == "Let me check."
    assert finish == "tool_calls"
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"])["unit"] == "celsius"


def test_tool_errors_are_400(server):
    cases = [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "name"),
        ({"tools": [{"type": "retrieval"}]}, "tools", "function"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array",
                                                                                  "uniqueItems": True}}}]},
         "tools", "uniqueItems"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "nope"}}]}, "tools", "schema"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
         "tool_choice", "other"),
        ({"tool_choice": "required"}, "tool_choice", "tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
         "tool_choice", "both"),
        ({"functions": [{"name": "f"}]}, "functions", "tools"),
    ]
    for extra, param, words in cases:
        r = chat(server, **extra)
        assert r.status_code == 400, (extra, r.text)
        err = r.json()["error"]
        assert err["param"] == param and words in err["message"], (extra, err)


def test_auto_without_a_parser_is_400():
    if not STORIES.exists():
        pytest.skip("missing test data")
    s = Server(["--chat-template", TOOLS_TEMPLATE]).start()
    try:
        r = chat(s, tools=[WEATHER])
        assert r.status_code == 400 and "--enable-auto-tool-choice" in r.json()["error"]["message"]
        r = chat(s, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls"
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_parser_splits_the_thinking_section(stream):
    if not STORIES.exists():
        pytest.skip("missing test data")
    s = Server(["--chat-template", THINK_TEMPLATE, "--reasoning-parser", "deepseek_r1"]).start()
    try:
        body = {"model": model_name(s), "messages": [{"role": "user", "content": "Once upon a time"}],
                "max_tokens": 200, "temperature": 0, "stream": stream,
                "guided_regex": "[a-z ]{5,40}\\.\\n</think>\\n\\n[A-Z][a-z ]{5,40}\\."}
        r = requests.post(s.url("/v1/chat/completions"), json=body, timeout=120, stream=stream)
        assert r.status_code == 200, r.text
        if not stream:
            msg = r.json()["choices"][0]["message"]
            reasoning, content = msg["reasoning_content"], msg["content"]
        else:
            reasoning = content = ""
            for line in r.iter_lines():
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    d = json.loads(line[6:])["choices"][0]["delta"]
                    reasoning += d.get("reasoning_content") or ""
                    content += d.get("content") or ""
        assert re.fullmatch(r"[a-z ]{5,40}\.\n", reasoning), reasoning
        assert re.fullmatch(r"\n*[A-Z][a-z ]{5,40}\.", content), content
    finally:
        assert s.stop() == 0


def test_qwen_template_renders_tools_and_results():
    """A real template (Qwen 2.5) gets the request's tools and tool messages."""
    if not STORIES.exists() or not QWEN_TEMPLATE.exists():
        pytest.skip("missing test data")
    s = Server(["--chat-template", str(QWEN_TEMPLATE)]).start()
    try:
        history = ASK + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]
        ids = requests.post(s.url("/tokenize"), json={"messages": history, "tools": [WEATHER]}, timeout=30).json()
        prompt = requests.post(s.url("/detokenize"), json={"tokens": ids["tokens"]}, timeout=30).json()["prompt"]
        assert '"name": "get_weather"' in prompt and "# Tools" in prompt
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}' in prompt
        assert "<tool_response>\n21 degrees\n</tool_response>" in prompt
    finally:
        assert s.stop() == 0
