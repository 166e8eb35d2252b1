"""An encoder cross-encoder (tiny random BertForSequenceClassification) behind
/v1/rerank, /score and /v1/score, against sentence-transformers'
CrossEncoder.predict (tests/fixtures/hf/rerank-tiny-bert.json, written by
tools/gen_cross_encoder_fixtures.py).

The folder is `make-dummy --format hf --shape tiny-bert-reranker --seed 1`
plus the fixture's WordPiece tokenizer: text pairs become [CLS] q [SEP] d
[SEP] with the document's tokens as type 1; the pooler (tanh) and the
classifier run on the host, then a sigmoid (CrossEncoder's default for one
label)."""

import json
import sys

import pytest
import requests

from conftest import BIN, REPO, Server

sys.path.insert(0, str(REPO / "tools"))
from gen_cross_encoder_fixtures import make_folder  # noqa: E402 (stdlib only at import)

FIXTURE = REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-bert.json"
TOL = 1e-4


@pytest.fixture(scope="module")
def ref():
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory, ref):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    folder = tmp_path_factory.mktemp("rerank") / "bert-reranker"
    make_folder(str(BIN), str(folder), ref["files"])
    s = Server(["--runner", "pooling", "--max-model-len", "128", "--kv-cache-dtype", "f32",
                "--served-model-name", "tiny-bert-rerank"], model=folder).start()
    yield s
    assert s.stop() == 0, s.output()


def test_types_matter(ref):
    # The fixture would not show segments are read if type 1 changed nothing.
    assert max(abs(a - b) for a, b in zip(ref["scores"], ref["scores_all_type_0"])) > 100 * TOL


def test_rerank_matches_cross_encoder(server, ref):
    n = len(ref["documents"])
    want = ref["scores"][:n]
    r = requests.post(server.url("/v1/rerank"), json={"model": "tiny-bert-rerank", "query": ref["query"],
                                                       "documents": ref["documents"]}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["total_tokens"] == sum(len(t) for t in ref["token_ids"][:n])
    got = {x["index"]: x["relevance_score"] for x in body["results"]}
    for i in range(n):
        assert abs(got[i] - want[i]) < TOL, (i, got[i], want[i])
    assert [x["index"] for x in body["results"]] == sorted(range(n), key=lambda i: -want[i])


def test_score_matches_cross_encoder(server, ref):
    n = len(ref["documents"])
    r = requests.post(server.url("/v1/score"), json={"text_1": ref["score_text_1"], "text_2": ref["score_text_2"]},
                      timeout=60)
    assert r.status_code == 200, r.text
    for d, w in zip(r.json()["data"], ref["scores"][n:]):
        assert abs(d["score"] - w) < TOL
    # 1:N on /score: the rerank's pairs, in order
    r = requests.post(server.url("/score"), json={"text_1": ref["query"], "text_2": ref["documents"]}, timeout=60)
    assert r.status_code == 200, r.text
    got = [d["score"] for d in r.json()["data"]]
    assert all(abs(g - w) < TOL for g, w in zip(got, ref["scores"][:n])), got
