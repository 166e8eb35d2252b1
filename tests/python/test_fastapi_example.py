"""examples/python/fastapi_server.py: /generate, streamed and not, and a 400."""

import importlib.util
import json
import os

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def client(stories_path):
    from fastapi.testclient import TestClient
    os.environ["PAGELLM_MODEL"] = stories_path
    try:
        spec = importlib.util.spec_from_file_location("fastapi_server", REPO / "examples/python/fastapi_server.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        del os.environ["PAGELLM_MODEL"]
    with TestClient(module.app) as c:
        yield c
    module.engine.shutdown()


def test_generate(client, llm):
    from pagellm import SamplingParams
    r = client.post("/generate", json={"prompt": "Once upon a time", "temperature": 0, "max_tokens": 16})
    assert r.status_code == 200
    expected = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert r.json() == {"text": [expected[0].outputs[0].text]}


def test_generate_streams(client):
    r = client.post("/generate", json={"prompt": "Once upon a time", "temperature": 0, "max_tokens": 16,
                                       "stream": True, "n": 2})
    assert r.status_code == 200
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert len(lines) > 1 and all(len(x["text"]) == 2 for x in lines)
    assert lines[-1]["text"][0].startswith(lines[0]["text"][0])


def test_bad_request(client):
    assert client.post("/generate", json={"prompt": "x", "temperature": -1}).status_code == 400
    assert client.post("/generate", json={"prompt": "x", "no_such_field": 1}).status_code == 400
