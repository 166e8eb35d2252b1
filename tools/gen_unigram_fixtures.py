#!/usr/bin/env python3
"""A tiny SentencePiece Unigram tokenizer and the ids Hugging Face `tokenizers`
gives for varied strings -> tests/fixtures/tokenizer/hf_unigram.json.

The tokenizer is trained here with tokenizers' UnigramTrainer in XLM-R's
layout: a Unigram model (pieces with log-probability scores, unk_id 3,
byte_fallback off), an NFC normalizer (XLM-R's is a Precompiled charsmap,
SentencePiece's nmt_nfkc, which pagellm does not read yet), a Metaspace
pre-tokenizer (prepend_scheme always) and RobertaProcessing-style pairs
(<s> a </s></s> b </s>). The test (tests/unit/tokenizer/fixtures_test.cpp)
loads the fixture's tokenizer.json and compares every case, so it needs no
Python.

  /work/fixvenv/bin/python tools/gen_unigram_fixtures.py
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "hf_unigram.json")
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello there, world of words.",
    "Unigram language models segment text into pieces by their probability.",
    "Café naïve résumé, the accents of French words.",
    "日本語のテキストと中文文本。",
    "Numbers like 1234 and 3.14 appear in text too.",
    "tokenization tokenizer tokens token",
    "multilingual embeddings and rerankers: bge-m3, multilingual-e5",
]

CASES = [
    "", " ", "Hello world", "hello  world  ", "   leading spaces", "trailing spaces   ",
    "The quick brown fox jumps over the lazy dog.", "tokenization of unbelievable words",
    "Café naïve résumé Ærøskøbing", "e\u0301 A\u030a decomposed accents", "日本語のテキスト、中文文本와 한국어",
    "Emoji 🦙🚀 and symbols ∑∫ unknown", "Numbers 1234567890 3.14159", "tabs\tand\nnewlines\n\n",
    "zzzz qqqq xyzzy", "<s> and </s> written as text", "bge-m3 multilingual-e5 rerankers",
]


def train():
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=180, special_tokens=SPECIALS, unk_token="<unk>",
                                      show_progress=False, shrinking_factor=0.75, max_piece_length=8)
    tok.train_from_iterator(CORPUS * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    return tok


def main():
    tok = train()
    cases = []
    for parse_special in (True, False):
        # parse_special=false: tokenizers' encode_special_tokens (specials are plain text).
        tok.encode_special_tokens = not parse_special
        for text in CASES:
            for add_special in (False, True):
                cases.append({"text": text, "add_special": add_special, "parse_special": parse_special,
                              "ids": tok.encode(text, add_special_tokens=add_special).ids})
    tok.encode_special_tokens = False
    pairs = [{"a": a, "b": b, "ids": tok.encode(a, b).ids}
             for a, b in [("Hello world", "the lazy dog"), ("日本語", "café"), ("", "x")]]
    meta = {"source": "tokenizers UnigramTrainer (tools/gen_unigram_fixtures.py)",
            "tokenizer_json": json.loads(tok.to_str()), "cases": cases, "pairs": pairs}
    with open(OUT, "w") as f:
        json.dump(meta, f, ensure_ascii=False, indent=0)
    print(tok.get_vocab_size(), "pieces;", sum(len(c["ids"]) for c in cases), "ids in", len(cases), "cases")


if __name__ == "__main__":
    main()
