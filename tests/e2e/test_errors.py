"""Every client error has OpenAI's error shape and the right status code
(raw HTTP with `requests`, where the openai client would hide details)."""

import openai
import pytest
import requests

from conftest import openai_client


def post(server, path, body=None, data=None, headers=None):
    if data is None:
        return requests.post(server.url(path), json=body, headers=headers, timeout=30)
    return requests.post(server.url(path), data=data, headers=headers or {"Content-Type": "application/json"},
                         timeout=30)


def check_error(r, status, param=None, contains=None):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    assert e["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    if param is not None:
        assert e["param"] == param, e
    if contains is not None:
        assert contains in e["message"], e["message"]
    return e


OK = {"prompt": "Once upon a time", "max_tokens": 4}


@pytest.mark.parametrize("data", [b"{", b"not json", b'{"prompt": "x",}', b"[1, 2]", b'"just a string"', b""])
def test_invalid_json(stories_server, data):
    check_error(post(stories_server, "/v1/completions", data=data), 400)


@pytest.mark.parametrize("field,value", [
    ("temperature", "hot"), ("top_p", [1]), ("n", "2"), ("max_tokens", 1.5), ("stream", "yes"),
    ("stop", 5), ("seed", "x"), ("logprobs", True), ("echo", 1), ("prompt", 5), ("prompt", [[1], "x"]),
    ("prompt", {"a": 1}), ("logit_bias", [1]), ("stop_token_ids", "x"), ("model", 5), ("user", 3),
    ("stream_options", "x"), ("ignore_eos", "no"),
])
def test_wrong_types(stories_server, field, value):
    check_error(post(stories_server, "/v1/completions", {**OK, field: value}), 400, param=field)


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.5), ("top_p", 0), ("top_p", 1.5), ("n", 0), ("n", -1), ("max_tokens", 0),
    ("max_tokens", -5), ("logprobs", 21), ("presence_penalty", 3), ("frequency_penalty", -2.5), ("min_p", 2),
    ("top_k", -2), ("repetition_penalty", 0), ("logit_bias", {"100000": 1}), ("logit_bias", {"5": 500}),
    ("stop_token_ids", [99999]), ("prompt", [99999]), ("prompt", []), ("min_tokens", 10),
])
def test_out_of_range(stories_server, field, value):
    check_error(post(stories_server, "/v1/completions", {**OK, field: value}), 400, param=field)


def test_context_length(stories_server):
    # stories260K's max_model_len is 512.
    check_error(post(stories_server, "/v1/completions", {**OK, "max_tokens": 510}), 400, param="max_tokens",
                contains="maximum context length is 512")
    long_prompt = list(range(3, 3 + 300)) * 2  # 600 token ids
    check_error(post(stories_server, "/v1/completions", {**OK, "prompt": long_prompt}), 400, param="prompt")
    with pytest.raises(openai.BadRequestError) as e:
        openai_client(stories_server).completions.create(model="stories260K", prompt="Hi", max_tokens=1000)
    assert e.value.status_code == 400


@pytest.mark.parametrize("data", [
    b'{"prompt": "abc\xff", "max_tokens": 2}',
    b'{"prompt": "\xc3\x28", "max_tokens": 2}',
    b'{"prompt": "\xed\xa0\x80", "max_tokens": 2}',          # an encoded surrogate
    b'{"prompt": "\\ud800", "max_tokens": 2}',               # a lone surrogate escape
    b'{"prompt": "ok", "stop": ["\xf8\x88\x80\x80\x80"], "max_tokens": 2}',
])
def test_malformed_utf8(stories_server, data):
    check_error(post(stories_server, "/v1/completions", data=data), 400)


def test_unsupported_features(stories_server):
    check_error(post(stories_server, "/v1/completions", {**OK, "best_of": 3}), 400, param="best_of")
    check_error(post(stories_server, "/v1/completions", {**OK, "suffix": "end"}), 400, param="suffix")
    check_error(post(stories_server, "/v1/completions", {**OK, "guided_json": 5}), 400, param="guided_json")
    check_error(post(stories_server, "/v1/completions", {**OK, "response_format": {"type": "yaml"}}), 400,
                param="response_format")
    check_error(post(stories_server, "/v1/completions", {**OK, "stream_options": {"include_usage": True}}), 400,
                param="stream_options")
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    # stories260K has no chat template.
    check_error(post(stories_server, "/v1/chat/completions", chat), 400, param="messages", contains="chat template")


def test_unknown_model(stories_server):
    e = check_error(post(stories_server, "/v1/completions", {**OK, "model": "gpt-4"}), 404, param="model")
    assert e["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        openai_client(stories_server).completions.create(model="nope", prompt="x", max_tokens=1)
    check_error(requests.get(stories_server.url("/v1/models/nope"), timeout=10), 404)


def test_unknown_route_and_method(stories_server):
    check_error(requests.get(stories_server.url("/v1/nothing"), timeout=10), 404)
    check_error(post(stories_server, "/v2/completions", OK), 404)
    r = requests.get(stories_server.url("/v1/completions"), timeout=10)
    check_error(r, 405)
    assert r.headers["Allow"] == "POST"
    check_error(requests.post(stories_server.url("/health"), json={}, timeout=10), 405)


def test_tokenize_errors(stories_server):
    check_error(post(stories_server, "/tokenize", {"prompt": 5}), 400, param="prompt")
    check_error(post(stories_server, "/detokenize", {"tokens": [1, 99999]}), 400, param="tokens")
    check_error(post(stories_server, "/detokenize", {"tokens": "x"}), 400, param="tokens")


def test_server_survives_bad_requests(stories_server):
    r = post(stories_server, "/v1/completions", {**OK, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"]


def test_embeddings_on_a_generation_server(stories_server):
    """--task generate (the default): /v1/embeddings is a 400 that says what the model is served for."""
    check_error(post(stories_server, "/v1/embeddings", {"input": "Once upon a time"}), 400,
                contains="for generation")
