"""/v1/rerank and /v1/score with --task score, through plain HTTP (no
official rerank client ships with the venv; the shapes are vLLM's).

A tiny random Qwen3-Reranker (tools/gen_rerank_fixtures.py): the same weights
served two ways, against transformers' scores (sigmoid(logit_yes - logit_no)
at the last token of Qwen3-Reranker's prompt) in
tests/fixtures/hf/rerank-tiny-qwen3.json:
  - the Hugging Face folder (`make-dummy --format hf --shape
    tiny-qwen3-reranker --seed 1`, its final norm scaled, plus the fixture's
    tokenizer: the generator's make_folder) with vLLM's --hf-overrides for
    Qwen3-Reranker;
  - llama.cpp's converted GGUF (rank pooling, cls.output, the rerank
    template), whose llama-server --rerank scores the fixture also holds.
  - a Qwen3ForSequenceClassification folder of the same layers with a random
    one-label score.weight, on raw pairs (vLLM's text pair), against
    transformers' AutoModelForSequenceClassification.
Prefill in chunks of 16 tokens."""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import BIN, REPO, Server

sys.path.insert(0, str(REPO / "tools"))
from gen_rerank_fixtures import make_folder  # noqa: E402 (stdlib only at import)

FIXTURE = REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.json"
GGUF = REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.gguf"
OVERRIDES = json.dumps({"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
                        "is_original_qwen3_reranker": True})
COMMON = ["--max-num-batched-tokens", "16", "--max-model-len", "256", "--kv-cache-dtype", "f32",
          "--served-model-name", "tiny-rerank"]
TOL = 1e-4


@pytest.fixture(scope="module")
def ref():
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory, ref):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    folder = tmp_path_factory.mktemp("rerank") / "qwen3-reranker-tiny"
    make_folder(str(BIN), str(folder), ref["files"])
    s = Server(["--task", "score", "--hf-overrides", OVERRIDES, *COMMON], model=folder).start()
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def seq_cls_server(tmp_path_factory, ref):
    """A Qwen3ForSequenceClassification folder (score.weight, one label): no flag, raw pairs."""
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    folder = tmp_path_factory.mktemp("rerank") / "seq-cls"
    make_folder(str(BIN), str(folder), ref["files"], ref["seq_cls"]["score_weight"])
    s = Server(["--runner", "pooling", *COMMON], model=folder).start()
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def gguf_server():
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    # vLLM's spelling: a rank GGUF under --runner pooling is served for scores.
    s = Server(["--runner", "pooling", *COMMON], model=GGUF).start()
    yield s
    assert s.stop() == 0, s.output()


def rerank(server, **body):
    return requests.post(server.url("/v1/rerank"), json=body, timeout=60)


def check_rerank(server, ref, want, token_ids=None):
    n = len(ref["documents"])
    token_ids = token_ids or ref["token_ids"]
    r = rerank(server, model="tiny-rerank", query=ref["query"], documents=ref["documents"])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "tiny-rerank" and body["id"].startswith("rerank-")
    assert body["usage"]["total_tokens"] == sum(len(t) for t in token_ids[:n])
    got = {x["index"]: x["relevance_score"] for x in body["results"]}
    for i in range(n):
        assert abs(got[i] - want[i]) < TOL, (i, got[i], want[i])
    assert [x["index"] for x in body["results"]] == sorted(range(n), key=lambda i: -want[i])
    assert all(x["document"]["text"] == ref["documents"][x["index"]] for x in body["results"])


def check_score(server, ref, want):
    n = len(ref["documents"])
    r = requests.post(server.url("/v1/score"), json={"model": "tiny-rerank", "text_1": ref["score_text_1"],
                                                      "text_2": ref["score_text_2"]}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "tiny-rerank"
    assert [d["index"] for d in body["data"]] == list(range(len(ref["score_text_2"])))
    assert all(d["object"] == "score" for d in body["data"])
    for d, w in zip(body["data"], want[n:]):
        assert abs(d["score"] - w) < TOL
    # 1:N on /score (the other spelling) is the rerank's pairs, in order
    r = requests.post(server.url("/score"), json={"text_1": ref["query"], "text_2": ref["documents"]}, timeout=60)
    assert [abs(d["score"] - w) < TOL for d, w in zip(r.json()["data"], want[:n])] == [True] * n


def test_hf_folder_matches_transformers(hf_server, ref):
    check_rerank(hf_server, ref, ref["scores"])
    check_score(hf_server, ref, ref["scores"])


def test_converted_gguf_matches_transformers_and_llama_server(gguf_server, ref):
    check_rerank(gguf_server, ref, ref["scores"])
    check_rerank(gguf_server, ref, ref["llama_server_scores"])
    check_score(gguf_server, ref, ref["scores"])


def test_sequence_classifier_matches_transformers(seq_cls_server, ref):
    want = ref["seq_cls"]["scores"]
    check_rerank(seq_cls_server, ref, want, ref["seq_cls"]["token_ids"])
    check_score(seq_cls_server, ref, want)


def test_top_n_documents_as_objects_and_concurrency(hf_server, ref):
    docs = [{"text": d} for d in ref["documents"]]
    r = requests.post(hf_server.url("/v2/rerank"), json={"query": ref["query"], "documents": docs, "top_n": 2,
                                                          "return_documents": False}, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2 and "document" not in results[0]
    best = max(range(len(ref["scores"][:len(docs)])), key=lambda i: ref["scores"][i])
    assert results[0]["index"] == best
    # the same scores alone, and from concurrent requests batched together
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda d: rerank(hf_server, query=ref["query"], documents=[d]).json(), ref["documents"]))
    for o, w in zip(outs, ref["scores"]):
        assert abs(o["results"][0]["relevance_score"] - w) < TOL


def error(r, status=400):
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_bad_input_names_the_field(hf_server, ref):
    assert error(rerank(hf_server, documents=["a"]))["param"] == "query"
    assert error(rerank(hf_server, query="q", documents=[]))["param"] == "documents"
    assert error(rerank(hf_server, query="q", documents=[3]))["param"] == "documents"
    assert error(rerank(hf_server, query="q", documents=["word " * 300]))["param"] == "documents"  # over 256
    post = lambda body: requests.post(hf_server.url("/v1/score"), json=body, timeout=60)
    assert error(post({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}))["param"] == "text_1"
    assert error(post({"text_1": "a"}))["param"] == "text_2"
    # the other tasks' endpoints name this one
    e = error(requests.post(hf_server.url("/v1/embeddings"), json={"input": "x"}, timeout=30))
    assert "--task score" in e["message"] and e["param"] == "model"
    e = error(requests.post(hf_server.url("/v1/completions"), json={"prompt": "x"}, timeout=30))
    assert "--task score" in e["message"]
    assert requests.get(hf_server.url("/health"), timeout=10).status_code == 200


def test_rerank_on_a_generation_server(stories_server):
    for path in ("/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score"):
        r = requests.post(stories_server.url(path), json={"query": "q", "documents": ["a"]}, timeout=30)
        e = error(r)
        assert "--task score" in e["message"] and e["param"] == "model", e


def test_score_task_refuses_what_it_cannot_build():
    # --hf-overrides on a GGUF: serve says why and exits
    model = REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.gguf"
    out = subprocess.run([str(BIN), "serve", str(model), "--task", "score", "--hf-overrides", OVERRIDES],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--hf-overrides applies to Hugging Face folders" in out.stdout + out.stderr
    # a reranker has no embeddings: --task embed says which task serves it
    out = subprocess.run([str(BIN), "serve", str(model), "--task", "embed"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert "serve it with --task score" in out.stdout + out.stderr
