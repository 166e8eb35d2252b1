"""An XLM-RoBERTa cross-encoder (tiny random XLMRobertaForSequenceClassification, bge-reranker-v2-m3's layout)
behind /v1/rerank and /v1/score, against sentence-transformers' CrossEncoder.predict
(tests/fixtures/hf/rerank-tiny-xlm-roberta.json, written by tools/gen_cross_encoder_fixtures.py).

The folder is `make-dummy --format hf --shape tiny-xlm-roberta-cls --seed 1` with the encoder's tensors under
roberta. and the fixture's Unigram tokenizer (Precompiled charsmap, RobertaProcessing): pairs become
<s> q </s></s> d </s>, every token type 0, positions past the padding row; the head (dense, tanh, out_proj) runs on
the host, then a sigmoid, or nothing when the config names Identity as the cross-encoder's activation."""

import json
import sys

import pytest
import requests

from conftest import BIN, REPO, Server

sys.path.insert(0, str(REPO / "tools"))
from gen_cross_encoder_fixtures import XLMR_SHAPE, make_folder  # noqa: E402 (stdlib only at import)

FIXTURE = REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-xlm-roberta.json"
TOL = 1e-4
NAME = "tiny-xlmr-rerank"


@pytest.fixture(scope="module")
def ref():
    return json.loads(FIXTURE.read_text())


def serve(folder):
    return Server(["--runner", "pooling", "--max-model-len", "128", "--kv-cache-dtype", "f32",
                   "--served-model-name", NAME], model=folder).start()


@pytest.fixture(scope="module")
def folder(tmp_path_factory, ref):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    folder = tmp_path_factory.mktemp("rerank") / "xlmr-reranker"
    make_folder(str(BIN), str(folder), ref["files"], XLMR_SHAPE)
    return folder


@pytest.fixture(scope="module")
def server(folder):
    s = serve(folder)
    yield s
    assert s.stop() == 0, s.output()


def test_rerank_matches_cross_encoder(server, ref):
    n = len(ref["documents"])
    want = ref["scores"][:n]
    r = requests.post(server.url("/v1/rerank"), json={"model": NAME, "query": ref["query"],
                                                       "documents": ref["documents"]}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    # The pairs' tokens are the tokenizer's (<s> q </s></s> d </s>, the empty document included).
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


def test_identity_activation_gives_the_logits(folder, ref, tmp_path):
    # sentence-transformers' config key for the cross-encoder's activation: Identity, the raw logit.
    cfg = json.loads((folder / "config.json").read_text())
    cfg["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
    copy = tmp_path / "identity"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / "config.json").write_text(json.dumps(cfg))
    s = serve(copy)
    try:
        n = len(ref["documents"])
        r = requests.post(s.url("/v1/rerank"), json={"query": ref["query"], "documents": ref["documents"]},
                          timeout=60)
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        for i in range(n):
            assert abs(got[i] - ref["scores_identity"][i]) < TOL, (i, got[i], ref["scores_identity"][i])
    finally:
        assert s.stop() == 0, s.output()
