"""LLM.embed (vLLM's shape: outputs.embedding) on a tiny random Qwen3 GGUF
(`pagellm make-dummy --shape tiny-qwen3 --seed 1`) against sentence-transformers'
last-token, normalised vectors (tests/fixtures/hf/embed-tiny-qwen3-f32-last.json)."""

import json
import math
import subprocess

import pytest

from conftest import BIN, REPO
from pagellm import LLM

FIXTURE = REPO / "tests" / "fixtures" / "hf" / "embed-tiny-qwen3-f32-last.json"


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    model = tmp_path_factory.mktemp("tiny") / "tiny-qwen3-f32.gguf"
    subprocess.run([str(BIN), "make-dummy", "--shape", "tiny-qwen3", "--type", "f32", "--seed", "1", "-o", str(model),
                    "-t", "1"], check=True, capture_output=True, timeout=120)
    return str(model)


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embed_matches_sentence_transformers(tiny_qwen3):
    ref = json.loads(FIXTURE.read_text())
    llm = LLM(model=tiny_qwen3, num_threads=1, max_model_len=128, kv_cache_dtype="f32", max_num_batched_tokens=16)
    outs = llm.embed([{"prompt_token_ids": t} for t in ref["tokens"]])
    assert [o.prompt_token_ids for o in outs] == ref["tokens"]
    for o, want in zip(outs, ref["embeddings"]):
        assert o.finished and len(o.outputs.embedding) == 256
        assert cosine(o.outputs.embedding, want) >= 0.9999
    text = llm.embed("hello world")[0].outputs.embedding
    assert abs(math.sqrt(sum(x * x for x in text)) - 1) < 1e-5
    assert llm.embed([]) == []
    with pytest.raises(ValueError):
        llm.embed({"prompt_token_ids": [1, 100000]})
    # generation still runs beside it
    assert llm.generate("hello", use_tqdm=False)[0].outputs[0].token_ids


def test_pooling_overrides(tiny_qwen3):
    ref = json.loads(FIXTURE.read_text())
    llm = LLM(model=tiny_qwen3, num_threads=1, max_model_len=128, kv_cache_dtype="f32", pooling="mean",
              normalize=False)
    one = ref["tokens"][0]  # one token: its mean is its last row, here not normalised
    v = llm.embed({"prompt_token_ids": one})[0].outputs.embedding
    n = math.sqrt(sum(x * x for x in v))
    assert abs(n - 1) > 1e-3
    assert max(abs(a / n - b) for a, b in zip(v, ref["embeddings"][0])) < 1e-5


def test_score_matches_transformers():
    """LLM.score (vLLM's shape: outputs.score) on the tiny reranker GGUF of tests/fixtures/hf/rerank-tiny-qwen3.json,
    one query against each document, and pair by pair."""
    ref = json.loads((REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.json").read_text())
    gguf = str(REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.gguf")
    llm = LLM(model=gguf, task="score", num_threads=1, max_model_len=256, kv_cache_dtype="f32")
    n = len(ref["documents"])
    outs = llm.score(ref["query"], ref["documents"])
    assert [o.prompt_token_ids for o in outs] == ref["token_ids"][:n]
    for o, want in zip(outs, ref["scores"][:n]):
        assert o.finished and abs(o.outputs.score - want) < 1e-4
    pairs = llm.score([ref["query"]] * 2, ref["documents"][:2])
    assert [p.outputs.score for p in pairs] == pytest.approx([o.outputs.score for o in outs[:2]], abs=1e-6)
    with pytest.raises(ValueError):
        llm.score([ref["query"]] * 2, ref["documents"][:3])
    assert llm.score("q", []) == []


def test_score_needs_a_score_head(tiny_qwen3):
    llm = LLM(model=tiny_qwen3, num_threads=1, max_model_len=128)
    with pytest.raises(ValueError):
        llm.score("query", "document")
