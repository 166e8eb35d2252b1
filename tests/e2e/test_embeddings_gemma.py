"""EmbeddingGemma (a tiny random Gemma3TextModel with use_bidirectional_attention) behind /v1/embeddings.

`pagellm make-dummy --format hf --shape tiny-embeddinggemma --seed 1` writes the same folder as
tools/gen_embedding_fixtures.py; this test adds the same sentence-transformers files (mean Pooling,
two Dense modules 256 -> 512 -> 256 without bias, Normalize) and compares the served vectors with
sentence-transformers' through the official openai client. The model's local layers see a symmetric
window of 8 (4 keys either side): the inputs of 1 and 5 tokens fit in it, those of 23 and 40 do not."""

import array
import json
import math
import struct
import subprocess

import pytest
import requests

from conftest import BIN, REPO, Server, openai_client

FIXTURE = REPO / "tests" / "fixtures" / "hf" / "embed-tiny-embeddinggemma-f32-mean.json"


def dense_weight(n_in, n_out, salt):
    """tools/gen_embedding_fixtures.py's Dense weights ([out, in], row-major)."""
    return [math.sin(1.7 * ((o * 131 + i * 71 + salt * 17) % 997)) / math.sqrt(n_in)
            for o in range(n_out) for i in range(n_in)]


def write_st_files(folder, dense):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 256, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}))
    for path, n_in, n_out, salt in dense:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": "sentence_transformers.models.Dense"})
        (folder / path).mkdir()
        (folder / path / "config.json").write_text(json.dumps(
            {"in_features": n_in, "out_features": n_out, "bias": False,
             "activation_function": "torch.nn.modules.linear.Identity"}))
        data = array.array("f", dense_weight(n_in, n_out, salt)).tobytes()
        header = json.dumps({"linear.weight": {"dtype": "F32", "shape": [n_out, n_in],
                                               "data_offsets": [0, len(data)]}}).encode()
        header += b" " * (-len(header) % 8)
        (folder / path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
    (folder / modules[-1]["path"]).mkdir()
    (folder / "modules.json").write_text(json.dumps(modules))


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    ref = json.loads(FIXTURE.read_text())
    tmp = tmp_path_factory.mktemp("tiny-embeddinggemma")
    folder = tmp / "hf"
    subprocess.run([str(BIN), "make-dummy", "--format", "hf", "--shape", "tiny-embeddinggemma", "--type", "f32",
                    "--seed", "1", "-o", str(folder)], check=True, capture_output=True, timeout=120)
    write_st_files(folder, ref["dense"])
    # The GGUF dummy's synthetic vocabulary (the inputs are token ids).
    vocab = tmp / "vocab.gguf"
    subprocess.run([str(BIN), "make-dummy", "--shape", "tiny-embeddinggemma", "--type", "f32", "--seed", "1",
                    "-o", str(vocab), "-t", "2"], check=True, capture_output=True, timeout=120)
    s = Server(["--task", "embed", "--tokenizer", str(vocab), "--max-num-batched-tokens", "48",
                "--max-model-len", "128", "--kv-cache-dtype", "f32", "--served-model-name", "embeddinggemma"],
               model=folder).start()
    yield s
    assert s.stop() == 0, s.output()


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_match_sentence_transformers(gemma_server):
    ref = json.loads(FIXTURE.read_text())
    assert ref["use_bidirectional_attention"] and ref["hf_sliding_window"] == 5
    client = openai_client(gemma_server)
    r = client.embeddings.create(model="embeddinggemma", input=ref["tokens"])
    assert [len(t) for t in ref["tokens"]] == [1, 5, 23, 40]
    for d, want in zip(r.data, ref["embeddings"]):
        assert len(d.embedding) == len(want) == 256
        assert cosine(d.embedding, want) >= 0.9999
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1) < 1e-5  # Normalize after the Dense modules
    # Matryoshka truncation of the projected vector, normalised again.
    t = client.embeddings.create(model="embeddinggemma", input=[ref["tokens"][2]], dimensions=128,
                                 encoding_format="float").data[0].embedding
    assert len(t) == 128 and abs(math.sqrt(sum(x * x for x in t)) - 1) < 1e-5
    assert cosine(t, r.data[2].embedding[:128]) > 0.99999


def test_generation_refused(gemma_server):
    r = requests.post(gemma_server.url("/v1/completions"), json={"prompt": [1, 2, 3], "max_tokens": 2}, timeout=30)
    assert r.status_code == 400, r.text
