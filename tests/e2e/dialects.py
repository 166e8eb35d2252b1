"""What tests/e2e/test_responses.py and test_anthropic_messages.py share: a
server of stories260K whose chat template is short enough for its 512-token
context yet renders tools, tool calls and tool results (as Qwen's does), and
opens a thinking section when `enable_thinking` is set; the hermes tool-call
parser and the qwen3 reasoning parser."""

import json

import requests

from conftest import STORIES, Server

TEMPLATE = (
    "{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>\n"
    "{% elif m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}</tool_call>\n{% endfor %}"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}assistant:"
    "{% if enable_thinking %}<think>\n{% endif %}")

SERVER_ARGS = ["--chat-template", TEMPLATE, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               "--reasoning-parser", "qwen3"]
MODEL = STORIES.stem  # the served name

WEATHER_SCHEMA = {"type": "object",
                  "properties": {"city": {"type": "string", "maxLength": 20},
                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"]}


def start_server(extra=()):
    return Server([*SERVER_ARGS, *extra]).start()


def chat_text(server, messages, headers=None, **kw):
    """The same request through /v1/chat/completions: its content."""
    body = {"model": MODEL, "messages": messages, **kw}
    r = requests.post(server.url("/v1/chat/completions"), json=body, headers=headers or {}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"], r.json()["usage"]


def sse_events(response):
    """(event, data) pairs of an SSE response read with requests."""
    out, event = [], None
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            out.append((event, json.loads(line[len("data: "):])))
            event = None
    return out
