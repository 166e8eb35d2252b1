#!/usr/bin/env python3
"""Regenerates the embedding fixtures in tests/fixtures/hf/ (pooling models).

`pagellm make-dummy --format hf` writes a tiny Qwen3 folder; this script adds
the sentence-transformers files a Qwen3-Embedding checkpoint ships
(modules.json, 1_Pooling/config.json, 2_Normalize) and a word-level tokenizer
(sentence-transformers wants one to load; the inputs are token ids and never
pass through it), loads the folder with sentence-transformers and pools fixed
token sequences one at a time. The tests regenerate the same folder from C++
(hf_writer + the same sentence-transformers files), load it with pagellm and
compare the vectors, so neither torch nor sentence-transformers is needed to
run them.

  python3 tools/gen_embedding_fixtures.py --pagellm build/pagellm

Needs torch, transformers and sentence-transformers (the fixtures: torch 2.15,
transformers 5.24, sentence-transformers 6.3.0, which imports scipy and
scikit-learn too).

Fixtures: embed-<shape>-<type>-<pooling>.json
  {"tokens": [[...], ...], "embeddings": [[...], ...], "pooling", "normalize", "seed", "reference"}
"""
import argparse
import array
import json
import math
import os
import struct
import subprocess
import tempfile

import numpy as np
import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer
from tokenizers import normalizers, pre_tokenizers, processors, decoders
from tokenizers.models import WordLevel, WordPiece
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "hf")
SEED = 1
# (shape, weight type, sentence-transformers pooling mode, Normalize module)
CASES = [("tiny-qwen3", "f32", "lasttoken", True), ("tiny-qwen3", "bf16", "lasttoken", True),
         ("tiny-qwen3", "f32", "mean", True),
         # An encoder (BertModel, bidirectional attention): CLS and mean pooling.
         ("tiny-bert", "f32", "cls", True), ("tiny-bert", "f32", "mean", True),
         # XLM-RoBERTa (XLMRobertaModel: bge-m3's CLS, multilingual-e5's mean), positions past the padding row.
         ("tiny-xlm-roberta", "f32", "cls", True), ("tiny-xlm-roberta", "f32", "mean", True),
         ("tiny-xlm-roberta", "bf16", "cls", True),
         # EmbeddingGemma (Gemma3TextModel, bidirectional, a symmetric window of 8 on the local layers):
         # mean pooling, then two Dense modules (256 -> 512 -> 256, no bias, identity), then Normalize.
         ("tiny-embeddinggemma", "f32", "mean", True), ("tiny-embeddinggemma", "bf16", "mean", True)]
# EmbeddingGemma's Dense modules: (folder, in, out, salt); 768 -> 3072 -> 768 in the real model.
DENSE = {"tiny-embeddinggemma": [("2_Dense", 256, 512, 2), ("3_Dense", 512, 256, 3)]}
POOLING_NAMES = {"lasttoken": "last", "mean": "mean", "cls": "cls"}


def inputs(first=1):
    """A few token sequences of different lengths: one past 2 KV blocks of 16 and a chunk. XLM-R's start with its
    <s> (0): its id 1 is the padding token, whose position transformers does not count."""
    rng = np.random.default_rng(4321)
    return [[first] + [int(t) for t in rng.integers(3, 512, size=n - 1)] for n in (1, 5, 23, 40)]


def dense_weight(n_in, n_out, salt):
    """A Dense module's [out, in] weights, row-major: fixed values from an integer hash (the C++ and e2e tests
    compute the same)."""
    return [math.sin(1.7 * ((o * 131 + i * 71 + salt * 17) % 997)) / math.sqrt(n_in)
            for o in range(n_out) for i in range(n_in)]


def write_dense_module(folder, path, n_in, n_out, salt):
    """A sentence-transformers Dense module as EmbeddingGemma ships it: no bias, identity activation."""
    os.makedirs(os.path.join(folder, path), exist_ok=True)
    with open(os.path.join(folder, path, "config.json"), "w") as f:
        json.dump({"in_features": n_in, "out_features": n_out, "bias": False,
                   "activation_function": "torch.nn.modules.linear.Identity"}, f)
    data = array.array("f", dense_weight(n_in, n_out, salt)).tobytes()
    header = json.dumps({"linear.weight": {"dtype": "F32", "shape": [n_out, n_in],
                                           "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(os.path.join(folder, path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


def write_sentence_transformers_files(folder, mode, normalize, vocab_size, dense=()):
    """What a sentence-transformers checkpoint adds to the model folder (the C++ test writes the same)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    for path, n_in, n_out, salt in dense:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": "sentence_transformers.models.Dense"})
        write_dense_module(folder, path, n_in, n_out, salt)
    if normalize:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    with open(os.path.join(folder, "modules.json"), "w") as f:
        json.dump(modules, f, indent=1)
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    flags = {f"pooling_mode_{k}": False for k in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                                                  "weightedmean_tokens", "lasttoken")}
    flags[{"lasttoken": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens",
           "cls": "pooling_mode_cls_token"}[mode]] = True
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 256, **flags, "include_prompt": True}, f, indent=1)
    if normalize:
        os.makedirs(os.path.join(folder, modules[-1]["path"]), exist_ok=True)
    # A word-level tokenizer over the dummy's vocabulary (never used on text here).
    tok = Tokenizer(WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0").save_pretrained(folder)


# Text through a BERT tokenizer: the encoder fixtures also carry a small
# WordPiece tokenizer.json over the dummy's vocabulary ([CLS] ... [SEP] from a
# TemplateProcessing post-processor, lower-casing BERT normalizer), a few
# strings, the ids transformers' tokenizer gives them, and their vectors
# (XLM-R: a Unigram tokenizer, xlm_roberta_tokenizer; its texts add
# full-width letters and a ligature for the charsmap).
TEXTS = ["Hello world!", "The quick brown foxes jumped over the lazy dogs.", "Ünïcode ACCENTS, digits 1234 and ?!",
         "", "unbelievable tokenization"]
XLMR_TEXTS = TEXTS + ["Ｈｅｌｌｏ ﬁnance   café 日本語", "multilingual rerankers: bge-m3"]


def wordpiece_tokenizer(vocab_size):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-")
    words += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    words += ["hello", "world", "the", "quick", "brown", "fox", "jump", "over", "lazy", "dog", "un", "##believ",
              "##able", "token", "##ization", "##es", "##ed", "##s", "and", "digits", "unicode", "accents", "##12",
              "##34"]
    words += [f"w{i}" for i in range(len(words), vocab_size)]
    tok = Tokenizer(WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None, clean_text=True,
                                                handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def xlm_roberta_tokenizer():
    """XLM-R's tokenizer layout at a fixture's size: the SentencePiece Unigram model of
    tests/fixtures/tokenizer/hf_unigram.json behind its Precompiled charsmap normalizer (<s> 0, <pad> 1, </s> 2,
    <unk> 3, <mask> 4, as XLM-R), Metaspace, and RobertaProcessing pairs (<s> a </s></s> b </s>). Like
    XLMRobertaTokenizer it gives no token_type_ids: every token is type 0."""
    with open(os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "hf_unigram.json")) as f:
        spec = json.load(f)["charsmap"]["tokenizer_json"]
    spec["post_processor"] = {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                              "trim_offsets": True, "add_prefix_space": True}
    tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                   cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                                   model_input_names=["input_ids", "attention_mask"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True, help="path to the pagellm binary")
    ap.add_argument("--only", default="", help="comma-separated shapes (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for shape, wtype, mode, normalize in CASES:
            if args.only and shape not in args.only.split(","):
                continue
            folder = os.path.join(tmp, f"{shape}-{wtype}-{mode}")
            subprocess.run([args.pagellm, "make-dummy", "--format", "hf", "--shape", shape, "--type", wtype,
                            "--seed", str(SEED), "-o", folder], check=True, capture_output=True)
            with open(os.path.join(folder, "config.json")) as f:
                vocab_size = json.load(f)["vocab_size"]
            write_sentence_transformers_files(folder, mode, normalize, vocab_size, DENSE.get(shape, ()))
            encoder = shape in ("tiny-bert", "tiny-xlm-roberta")
            xlmr = shape == "tiny-xlm-roberta"
            seqs = inputs(0 if xlmr else 1)
            if xlmr:
                xlm_roberta_tokenizer().save_pretrained(folder)
            elif encoder:
                wordpiece_tokenizer(vocab_size).save_pretrained(folder)
            model = SentenceTransformer(folder, device="cpu", model_kwargs={"dtype": torch.float32,
                                                                            "attn_implementation": "eager"})
            model.eval()
            vectors = []
            with torch.no_grad():
                for ids in seqs:
                    features = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids),
                                                                                             dtype=torch.long)}
                    vectors.append(model(features)["sentence_embedding"][0].float().tolist())
            name = f"embed-{shape}-{wtype}-{POOLING_NAMES[mode]}"
            extra = {}
            if shape in DENSE:
                # The model as transformers loaded it: bidirectional, and the window it masks with.
                cfg = model[0].auto_model.config
                extra["dense"] = [list(d) for d in DENSE[shape]]
                extra["hf_sliding_window"] = cfg.sliding_window
                extra["use_bidirectional_attention"] = cfg.use_bidirectional_attention
            if encoder:
                with open(os.path.join(folder, "tokenizer.json")) as f:
                    extra["tokenizer_json"] = json.load(f)
                # transformers' own last hidden states, unnormalised: position 0 and the
                # mean over positions (pooled vectors are normalised, which would hide a scale).
                bert = model[0].auto_model
                with torch.no_grad():
                    hidden = [bert(input_ids=torch.tensor([ids])).last_hidden_state[0].double() for ids in seqs]
                extra["hidden_first"] = [h[0].tolist() for h in hidden]
                extra["hidden_mean"] = [h.mean(0).tolist() for h in hidden]
                texts = XLMR_TEXTS if xlmr else TEXTS
                extra["texts"] = texts
                extra["text_ids"] = [model.tokenizer(t)["input_ids"] for t in texts]
                with torch.no_grad():
                    extra["text_embeddings"] = [model.encode([t], convert_to_numpy=True)[0].astype(float).tolist()
                                                for t in texts]
            meta = {"shape": shape, "type": wtype, "seed": SEED, "pooling": POOLING_NAMES[mode],
                    "normalize": normalize, "tokens": seqs, "embeddings": vectors, **extra,
                    "reference": f"sentence-transformers {sentence_transformers.__version__} (transformers "
                                 f"{transformers.__version__}, torch {torch.__version__}), float32, eager attention"}
            with open(os.path.join(OUT, name + ".json"), "w") as f:
                json.dump(meta, f)
            print(name, "norms:", [round(float(np.linalg.norm(v)), 4) for v in vectors])


if __name__ == "__main__":
    main()
