"""/v1/chat/completions on Gemma 3 270M (its built-in chat template): replies,
streaming deltas, usage against /tokenize, logprobs, template errors."""

import openai
import pytest
import requests

from conftest import model_name, openai_client

# The default model is the pretrained Gemma 3 270M: one example exchange makes it answer.
QUESTION = [
    {"role": "user", "content": "What is the capital of Germany?"},
    {"role": "assistant", "content": "Berlin."},
    {"role": "user", "content": "What is the capital of France?"},
]


def chat(server, **kw):
    body = {"model": model_name(server), "messages": QUESTION, "max_tokens": 8, "temperature": 0, **kw}
    return requests.post(server.url("/v1/chat/completions"), json=body, timeout=120)


def test_chat_completion(gemma_server):
    client = openai_client(gemma_server)
    name = model_name(gemma_server)
    c = client.chat.completions.create(model=name, messages=QUESTION, max_tokens=8, temperature=0, stop=["."])
    assert c.object == "chat.completion" and c.id.startswith("chatcmpl-") and c.model == name
    msg = c.choices[0].message
    assert msg.role == "assistant"
    assert msg.content.strip() == "Paris"
    assert c.choices[0].finish_reason == "stop"
    # Usage: the prompt is the rendered template, as /tokenize counts it.
    tok = requests.post(gemma_server.url("/tokenize"), json={"messages": QUESTION}, timeout=30).json()
    assert c.usage.prompt_tokens == tok["count"]
    assert 0 < c.usage.completion_tokens <= 3
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens


def test_chat_streaming(gemma_server):
    client = openai_client(gemma_server)
    full = client.chat.completions.create(model=model_name(gemma_server), messages=QUESTION, max_tokens=8,
                                          temperature=0).choices[0].message.content
    chunks = list(client.chat.completions.create(model=model_name(gemma_server), messages=QUESTION, max_tokens=8,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_chat_parts_system_and_max_completion_tokens(gemma_server):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"},
                                     {"type": "text", "text": "One word."}]},
    ]
    r = chat(gemma_server, messages=messages, max_tokens=None, max_completion_tokens=3, n=2)
    assert r.status_code == 200, r.text
    c = r.json()
    assert len(c["choices"]) == 2 and c["usage"]["completion_tokens"] <= 6
    assert c["choices"][0]["message"]["content"] == c["choices"][1]["message"]["content"]


def test_chat_logprobs(gemma_server):
    r = chat(gemma_server, logprobs=True, top_logprobs=2, max_tokens=4)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert 0 < len(content) <= 4
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert bytes(entry["bytes"]).decode(errors="replace") == entry["token"]
        assert len(entry["top_logprobs"]) == 2
        assert abs(entry["top_logprobs"][0]["logprob"] - entry["logprob"]) < 1e-4  # greedy


def test_continue_final_message(gemma_server):
    messages = QUESTION + [{"role": "assistant", "content": "The capital of France is"}]
    r = chat(gemma_server, messages=messages, continue_final_message=True, add_generation_prompt=False,
             max_tokens=4)
    assert r.status_code == 200, r.text
    assert "paris" in r.json()["choices"][0]["message"]["content"].lower()


def test_chat_errors(gemma_server):
    def err(r, param=None):
        assert r.status_code == 400, r.text
        e = r.json()["error"]
        if param:
            assert e["param"] == param
        return e["message"]

    # The template's own raise_exception comes back as the message.
    bad_order = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert "alternate" in err(chat(gemma_server, messages=bad_order), "messages")
    err(chat(gemma_server, messages=[]), "messages")
    err(chat(gemma_server, messages="hi"), "messages")
    err(chat(gemma_server, messages=[{"content": "no role"}]), "messages")
    err(chat(gemma_server, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    # tool_choice auto (the default with tools) needs --tool-call-parser
    assert "--enable-auto-tool-choice" in err(chat(gemma_server, tools=tools), "tool_choice")
    err(chat(gemma_server, tool_choice="required"), "tool_choice")
    err(chat(gemma_server, response_format={"type": "json_schema"}), "response_format")
    err(chat(gemma_server, top_logprobs=2), "top_logprobs")
    err(chat(gemma_server, max_completion_tokens=0), "max_completion_tokens")
    err(chat(gemma_server, continue_final_message=True, add_generation_prompt=True), "continue_final_message")
    with pytest.raises(openai.BadRequestError):
        openai_client(gemma_server).chat.completions.create(model=model_name(gemma_server), messages=bad_order)
