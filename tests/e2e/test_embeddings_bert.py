"""An encoder (tiny random BertModel, bidirectional attention) behind /v1/embeddings.

`pagellm make-dummy --shape tiny-bert --seed 1` writes the same weights as the HF
folder of tools/gen_embedding_fixtures.py; its vectors, CLS-pooled and
normalised, are compared with sentence-transformers' through the official
openai client. Each input is computed in one step: one longer than
--max-num-batched-tokens is refused, and the server does not generate."""

import json
import math
import subprocess

import pytest
import requests

from conftest import BIN, REPO, Server, openai_client

FIXTURE = REPO / "tests" / "fixtures" / "hf" / "embed-tiny-bert-f32-cls.json"


@pytest.fixture(scope="module")
def bert_model(tmp_path_factory):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    model = tmp_path_factory.mktemp("tiny") / "tiny-bert-f32.gguf"
    subprocess.run([str(BIN), "make-dummy", "--shape", "tiny-bert", "--type", "f32", "--seed", "1", "-o", str(model),
                    "-t", "2"], check=True, capture_output=True, timeout=120)
    return model


@pytest.fixture(scope="module")
def bert_server(bert_model):
    # No --pooling: an encoder without a stated pooling pools its [CLS] row.
    s = Server(["--task", "embed", "--max-num-batched-tokens", "48", "--max-model-len", "128",
                "--kv-cache-dtype", "f32", "--served-model-name", "tiny-bert"], model=bert_model).start()
    yield s
    assert s.stop() == 0, s.output()


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_match_sentence_transformers(bert_server):
    ref = json.loads(FIXTURE.read_text())
    client = openai_client(bert_server)
    r = client.embeddings.create(model="tiny-bert", input=ref["tokens"])
    assert [d.index for d in r.data] == list(range(len(ref["tokens"])))
    for d, want in zip(r.data, ref["embeddings"]):
        assert cosine(d.embedding, want) >= 0.9999
    # One at a time: the same vectors (nothing from the prefix cache, no neighbour in the batch matters).
    for toks, want in zip(ref["tokens"], r.data):
        one = client.embeddings.create(model="tiny-bert", input=[toks], encoding_format="float").data[0].embedding
        assert max(abs(x - y) for x, y in zip(one, want.embedding)) < 1e-5


def test_long_input_and_generation_refused(bert_server, bert_model):
    r = requests.post(bert_server.url("/v1/embeddings"), json={"input": list(range(3, 63))}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input"
    assert "one step" in r.json()["error"]["message"]
    out = subprocess.run([str(BIN), "serve", str(bert_model)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--task embed" in out.stdout + out.stderr


@pytest.fixture(scope="module")
def bert_folder_server(tmp_path_factory):
    """The HF folder as sentence-transformers ships one: modules.json picks CLS pooling and Normalize, and
    tokenizer.json is the fixture's WordPiece tokenizer, so text goes in."""
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    ref = json.loads(FIXTURE.read_text())
    folder = tmp_path_factory.mktemp("tiny-bert-hf")
    subprocess.run([str(BIN), "make-dummy", "--format", "hf", "--shape", "tiny-bert", "--type", "f32", "--seed", "1",
                    "-o", str(folder)], check=True, capture_output=True, timeout=120)
    (folder / "tokenizer.json").write_text(json.dumps(ref["tokenizer_json"]))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 256, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    (folder / "2_Normalize").mkdir()
    s = Server(["--task", "embed", "--max-model-len", "128", "--kv-cache-dtype", "f32",
                "--served-model-name", "tiny-bert"], model=folder).start()
    yield s
    assert s.stop() == 0, s.output()


def test_text_through_the_folders_tokenizer(bert_folder_server):
    ref = json.loads(FIXTURE.read_text())
    client = openai_client(bert_folder_server)
    r = client.embeddings.create(model="tiny-bert", input=ref["texts"], encoding_format="float")
    for text, ids, d, want in zip(ref["texts"], ref["text_ids"], r.data, ref["text_embeddings"]):
        assert cosine(d.embedding, want) >= 0.9999, text
    assert r.usage.prompt_tokens == sum(len(i) for i in ref["text_ids"])
