"""/v1/embeddings with --task embed, through the official openai client.

A tiny random Qwen3 (`pagellm make-dummy --shape tiny-qwen3 --seed 1`, the same
weights as the HF folder of tools/gen_embedding_fixtures.py) pooled at the last
token and normalised, against sentence-transformers' vectors in
tests/fixtures/hf/embed-tiny-qwen3-f32-last.json; prefill in chunks of 16."""

import base64
import json
import math
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import BIN, REPO, Server, openai_client

FIXTURE = REPO / "tests" / "fixtures" / "hf" / "embed-tiny-qwen3-f32-last.json"


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    model = tmp_path_factory.mktemp("tiny") / "tiny-qwen3-f32.gguf"
    subprocess.run([str(BIN), "make-dummy", "--shape", "tiny-qwen3", "--type", "f32", "--seed", "1", "-o", str(model),
                    "-t", "2"], check=True, capture_output=True, timeout=120)
    s = Server(["--task", "embed", "--max-num-batched-tokens", "16", "--max-model-len", "128",
                "--kv-cache-dtype", "f32", "--served-model-name", "tiny-embed"], model=model).start()
    yield s
    assert s.stop() == 0, s.output()


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def embed(server, **body):
    return requests.post(server.url("/v1/embeddings"), json=body, timeout=60)


def test_match_sentence_transformers(embed_server):
    ref = json.loads(FIXTURE.read_text())
    client = openai_client(embed_server)
    # The client asks for base64 by default and decodes it.
    r = client.embeddings.create(model="tiny-embed", input=ref["tokens"])
    assert r.object == "list" and r.model == "tiny-embed"
    assert [d.index for d in r.data] == list(range(len(ref["tokens"])))
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(t) for t in ref["tokens"])
    for d, want in zip(r.data, ref["embeddings"]):
        assert len(d.embedding) == len(want)
        assert cosine(d.embedding, want) >= 0.9999
    # float format: the same vectors
    f = client.embeddings.create(model="tiny-embed", input=ref["tokens"], encoding_format="float")
    for a, b in zip(f.data, r.data):
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-6


def test_shapes_dimensions_and_base64(embed_server):
    client = openai_client(embed_server)
    one = client.embeddings.create(model="tiny-embed", input="hello world", encoding_format="float").data[0].embedding
    assert abs(math.sqrt(sum(x * x for x in one)) - 1) < 1e-5
    two = client.embeddings.create(model="tiny-embed", input=["hello world", "other text"], encoding_format="float")
    assert max(abs(x - y) for x, y in zip(two.data[0].embedding, one)) < 1e-5
    ids = embed(embed_server, input=[5, 6, 7], encoding_format="float").json()["data"][0]["embedding"]
    assert len(ids) == 256
    # Matryoshka: the first 8 values, normalised again
    short = client.embeddings.create(model="tiny-embed", input="hello world", dimensions=8,
                                     encoding_format="float").data[0].embedding
    n = math.sqrt(sum(x * x for x in one[:8]))
    assert max(abs(a - b / n) for a, b in zip(short, one[:8])) < 1e-5
    raw = embed(embed_server, input="hello world", encoding_format="base64").json()["data"][0]["embedding"]
    decoded = struct.unpack("<256f", base64.b64decode(raw))
    assert max(abs(a - b) for a, b in zip(decoded, one)) < 1e-6


def test_same_vector_alone_batched_and_concurrent(embed_server):
    ref = json.loads(FIXTURE.read_text())
    x = ref["tokens"][-1]
    alone = embed(embed_server, input=[x], encoding_format="float").json()["data"][0]["embedding"]
    batched = embed(embed_server, input=[[9, 8, 7], x, list(range(3, 60))],
                    encoding_format="float").json()["data"][1]["embedding"]
    assert max(abs(a - b) for a, b in zip(alone, batched)) < 1e-5
    with ThreadPoolExecutor(8) as pool:
        bodies = [{"input": [x] if i % 2 == 0 else [list(range(10 + i, 50))], "encoding_format": "float"}
                  for i in range(8)]
        outs = list(pool.map(lambda b: embed(embed_server, **b).json()["data"][0]["embedding"], bodies))
    for i in range(0, 8, 2):
        assert max(abs(a - b) for a, b in zip(alone, outs[i])) < 1e-5


def error(r, status=400):
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_bad_requests_name_the_field(embed_server):
    assert error(embed(embed_server, input=[]))["param"] == "input"
    assert error(embed(embed_server))["param"] == "input"
    assert error(embed(embed_server, input=[1, [2]]))["param"] == "input"
    assert error(embed(embed_server, input=[[]]))["param"] == "input"
    assert error(embed(embed_server, input=list(range(3, 200))))["param"] == "input"  # over --max-model-len 128
    assert error(embed(embed_server, input="x", dimensions=257))["param"] == "dimensions"
    assert error(embed(embed_server, input="x", encoding_format="int8"))["param"] == "encoding_format"
    assert error(embed(embed_server, input="x", model="other"), 404)["param"] == "model"
    # generation endpoints name the task
    e = error(requests.post(embed_server.url("/v1/chat/completions"),
                            json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30))
    assert "embed" in e["message"]
    e = error(requests.post(embed_server.url("/v1/completions"), json={"prompt": "hi"}, timeout=30))
    assert "embed" in e["message"]
    assert requests.get(embed_server.url("/health"), timeout=10).status_code == 200
