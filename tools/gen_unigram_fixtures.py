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


# SentencePiece normalization rules (code points, hex) for a small precompiled
# charsmap: full-width letters and digits, ligatures, a composed accent,
# circled digits, NBSP. XLM-R's nmt_nfkc map is NFKC's (240 KB); this one
# exercises the same trie format at a fixture's size.
def charsmap_rules():
    rules = [(0xFF21 + i, [0x41 + i]) for i in range(26)] + [(0xFF41 + i, [0x61 + i]) for i in range(26)]
    rules += [(0xFF10 + i, [0x30 + i]) for i in range(10)] + [(0x2460 + i, [0x31 + i]) for i in range(9)]
    rules += [(0xFB01, [0x66, 0x69]), (0xFB02, [0x66, 0x6C]), (0x00A0, [0x20]), (0x3000, [0x20])]
    lines = ["%X\t%s" % (src, " ".join("%X" % c for c in dst)) for src, dst in rules]
    lines += ["65 301\tE9", "61 308\tE4", "2126\t3A9"]  # e + acute -> é, a + diaeresis -> ä, ohm -> omega
    return "\n".join(lines) + "\n"


def precompiled_charsmap(tmp):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    rules = os.path.join(tmp, "rules.tsv")
    with open(rules, "w") as f:
        f.write(charsmap_rules())
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 3), model_prefix=os.path.join(tmp, "m"),
                                   vocab_size=100, model_type="unigram", normalization_rule_tsv=rules,
                                   hard_vocab_limit=False, character_coverage=1.0, minloglevel=2)
    proto = sentencepiece_model_pb2.ModelProto()
    with open(os.path.join(tmp, "m.model"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto.normalizer_spec.precompiled_charsmap


CHARSMAP_CASES = ["Ｈｅｌｌｏ ｗｏｒｌｄ", "ﬁnance ﬂow", "cafe\u0301 na\u0308ive", "①②③ ２０２４", "a\u00a0b\u3000c",
                  "Ω ohm \u2126", "spaces   collapse    here", "plain text", "", "日本語 ＡＢＣ 🦙",
                  "e\u0301\u0301 double accents"]


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
    nfc_json = json.loads(tok.to_str())
    # XLM-R's normalizer: the charsmap, then runs of spaces collapsed.
    import tempfile
    from tokenizers import Regex
    with tempfile.TemporaryDirectory() as tmp:
        charsmap = precompiled_charsmap(tmp)
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(charsmap), normalizers.Replace(Regex(" {2,}"), " ")])
    charsmap_cases = [{"text": t, "add_special": True, "parse_special": True, "ids": tok.encode(t).ids}
                      for t in CHARSMAP_CASES]
    charsmap_json = json.loads(tok.to_str())
    meta = {"source": "tokenizers UnigramTrainer (tools/gen_unigram_fixtures.py)",
            "tokenizer_json": nfc_json, "cases": cases, "pairs": pairs,
            "charsmap": {"tokenizer_json": charsmap_json, "cases": charsmap_cases,
                         "source": "the same model, normalizer Sequence[Precompiled (a charsmap sentencepiece "
                                   "compiled from charsmap_rules()), Replace(' {2,}', ' ')]"}}
    with open(OUT, "w") as f:
        json.dump(meta, f, ensure_ascii=False, indent=0)
    print(tok.get_vocab_size(), "pieces;", sum(len(c["ids"]) for c in cases), "ids in", len(cases), "cases")


if __name__ == "__main__":
    main()
