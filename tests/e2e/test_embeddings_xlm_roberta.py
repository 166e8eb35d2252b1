"""An XLM-RoBERTa embedder (tiny random XLMRobertaModel: bge-m3's CLS pooling, multilingual-e5's mean) behind
/v1/embeddings, against sentence-transformers (tests/fixtures/hf/embed-tiny-xlm-roberta-f32-{cls,mean}.json, written
by tools/gen_embedding_fixtures.py).

The HF folder is `make-dummy --format hf --shape tiny-xlm-roberta --seed 1` with the sentence-transformers files
(modules.json, 1_Pooling, 2_Normalize) and the fixture's Unigram tokenizer.json (Precompiled charsmap, Metaspace,
RobertaProcessing), so text goes in. The GGUF dummy of the same shape is XLM-R as llama.cpp's converter writes it
(arch bert, the position table from position 0): it computes the same vectors."""

import json
import math
import subprocess

import pytest

from conftest import BIN, REPO, Server, openai_client

FIXTURES = REPO / "tests" / "fixtures" / "hf"


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def write_folder(folder, ref, pooling):
    subprocess.run([str(BIN), "make-dummy", "--format", "hf", "--shape", "tiny-xlm-roberta", "--type", "f32",
                    "--seed", "1", "-o", str(folder)], check=True, capture_output=True, timeout=120)
    (folder / "tokenizer.json").write_text(json.dumps(ref["tokenizer_json"]))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 256, "pooling_mode_cls_token": pooling == "cls",
         "pooling_mode_mean_tokens": pooling == "mean"}))
    (folder / "2_Normalize").mkdir()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_folder_text_and_ids_match_sentence_transformers(tmp_path, pooling):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    ref = json.loads((FIXTURES / f"embed-tiny-xlm-roberta-f32-{pooling}.json").read_text())
    folder = tmp_path / "tiny-xlmr"
    write_folder(folder, ref, pooling)
    s = Server(["--task", "embed", "--max-model-len", "128", "--kv-cache-dtype", "f32",
                "--served-model-name", "tiny-xlmr"], model=folder).start()
    try:
        client = openai_client(s)
        r = client.embeddings.create(model="tiny-xlmr", input=ref["texts"], encoding_format="float")
        for text, d, want in zip(ref["texts"], r.data, ref["text_embeddings"]):
            assert cosine(d.embedding, want) >= 0.9999, text
        assert r.usage.prompt_tokens == sum(len(i) for i in ref["text_ids"])
        r = client.embeddings.create(model="tiny-xlmr", input=ref["tokens"], encoding_format="float")
        for d, want in zip(r.data, ref["embeddings"]):
            assert cosine(d.embedding, want) >= 0.9999
    finally:
        assert s.stop() == 0, s.output()


def test_gguf_dummy_is_the_same_model(tmp_path):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    ref = json.loads((FIXTURES / "embed-tiny-xlm-roberta-f32-cls.json").read_text())
    model = tmp_path / "tiny-xlm-roberta.gguf"
    subprocess.run([str(BIN), "make-dummy", "--shape", "tiny-xlm-roberta", "--type", "f32", "--seed", "1", "-o",
                    str(model)], check=True, capture_output=True, timeout=120)
    s = Server(["--task", "embed", "--max-model-len", "128", "--kv-cache-dtype", "f32",
                "--served-model-name", "tiny-xlmr"], model=model).start()
    try:
        r = openai_client(s).embeddings.create(model="tiny-xlmr", input=ref["tokens"], encoding_format="float")
        for d, want in zip(r.data, ref["embeddings"]):
            assert cosine(d.embedding, want) >= 0.9999
    finally:
        assert s.stop() == 0, s.output()
