#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus, tests/fuzz/corpus/<target>/, from the test
fixtures (and ../shared/data when it is there). The output is committed, so
the fuzzers and the replay test need neither this script nor ../shared; run it
again after changing it:

    python3 tests/fuzz/make_corpus.py

Seeds are small on purpose: libFuzzer mutates every byte, so a seed should
be all structure. Real vocabularies and tokenizer.json files are cut down to
their first few hundred tokens (merges kept where all three tokens survive).
"""
import json
import re
import shutil
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED = ROOT.parent / "shared" / "data"
CORPUS = HERE / "corpus"
KEEP_TOKENS = 400

# ---------------------------------------------------------------- GGUF

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
          I64: "<q", F64: "<d"}
# GGML tensor types: id, elements per block, bytes per block.
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144),
        "BF16": (30, 1, 2)}


def gguf_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == STRING:
        return gguf_str(v)
    if t == ARRAY:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(gguf_value(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def write_gguf(kv, tensors=(), version=3, align=32):
    """kv: [(key, type, value)], arrays as (ARRAY, (elem_type, [values]));
    tensors: [(name, ggml type name, shape ne[0] first)] with deterministic bytes."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, t, v in kv:
        head += gguf_str(key) + struct.pack("<I", t) + gguf_value(t, v)
    data = b""
    for name, tname, shape in tensors:
        tid, bs, bb = GGML[tname]
        n = 1
        for d in shape:
            n *= d
        nbytes = n // bs * bb
        head += gguf_str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<q", d) for d in shape)
        head += struct.pack("<IQ", tid, len(data))
        blob = bytes((i * 37 + len(name)) % 251 for i in range(nbytes))
        data += blob + b"\0" * (-len(blob) % align)
    head += b"\0" * (-len(head) % align)
    return head + data


def read_gguf_kv(path):
    """The metadata of a GGUF file: [(key, type, value)] (tensor infos are not read)."""
    b = path.read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, b, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = b[pos:pos + n]
        pos += n
        return s

    def value(t):
        if t == STRING:
            return string()
        if t == ARRAY:
            et, n = take("<I"), take("<Q")
            return (et, [value(et) for _ in range(n)])
        return take(SCALAR[t])

    assert b[:4] == b"GGUF", path
    pos = 4
    take("<I")
    take("<Q")
    n_kv = take("<Q")
    out = []
    for _ in range(n_kv):
        key = string().decode()
        t = take("<I")
        out.append((key, t, value(t)))
    return out


def shrink_vocab_kv(kv, keep=KEEP_TOKENS):
    """Cuts tokenizer.ggml.* arrays to the first `keep` tokens; merges survive
    when both halves and the result do."""
    tokens = next(v[1] for k, t, v in kv if k == "tokenizer.ggml.tokens")[:keep]
    kept = set(tokens)
    out = []
    for k, t, v in kv:
        if t == ARRAY and k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            v = (v[0], v[1][:keep])
        elif t == ARRAY and k == "tokenizer.ggml.merges":
            merges = []
            for m in v[1]:
                a, _, c = m.partition(b" ")
                if a in kept and c in kept and a + c in kept:
                    merges.append(m)
            v = (v[0], merges)
        elif t == ARRAY:
            continue  # other big arrays (e.g. token counts) say nothing new
        elif k.endswith("_token_id") and v >= keep:
            v = keep - 1
        out.append((k, t, v))
    return out


def byte_level_alphabet():
    """GPT-2's byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for c in range(256):
        if c not in bs:
            bs.append(c)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def arch_kv(arch, n_embd=8, n_layer=1, n_head=2, n_head_kv=1, extra=()):
    kv = [("general.architecture", STRING, arch), ("general.name", STRING, f"seed {arch}"),
          ("general.alignment", U32, 32),
          (f"{arch}.context_length", U32, 64), (f"{arch}.embedding_length", U32, n_embd),
          (f"{arch}.block_count", U32, n_layer), (f"{arch}.feed_forward_length", U32, 16),
          (f"{arch}.attention.head_count", U32, n_head), (f"{arch}.attention.head_count_kv", U32, n_head_kv),
          (f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-6), (f"{arch}.rope.freq_base", F32, 10000.0)]
    return kv + list(extra)


def spm_vocab_kv():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581a", "\u2581the", "lo"]
    types = [2, 3, 3] + [6] * 256 + [1, 1, 1]
    return [("tokenizer.ggml.model", STRING, "llama"), ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
            ("tokenizer.ggml.scores", ARRAY, (F32, [0.0] * 259 + [-1.0, -2.0, -3.0])),
            ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
            ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
            ("tokenizer.ggml.unknown_token_id", U32, 0), ("tokenizer.ggml.add_space_prefix", BOOL, True),
            ("tokenizer.chat_template", STRING, "{% for m in messages %}{{ m['content'] }}{% endfor %}")]


def bpe_vocab_kv(pre):
    alphabet = byte_level_alphabet()
    merges = ["h e", "l l", "he ll", "Ġ t", "Ġt he", "o r"]
    tokens = alphabet + ["he", "ll", "hell", "Ġt", "Ġthe", "or", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]
    return [("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, pre),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)), ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
            ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
            ("tokenizer.ggml.eos_token_id", U32, len(tokens) - 3),
            ("tokenizer.ggml.eot_token_id", U32, len(tokens) - 1)]


def wordpiece_vocab_kv():
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghijklmnopqrstuvwxyz0123456789.,!?") + [
        "hello", "world", "##s", "##ing", "un", "##able"]
    return [("tokenizer.ggml.model", STRING, "bert"), ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
            ("tokenizer.ggml.token_type", ARRAY, (I32, [3, 1, 3, 3, 3] + [1] * (len(tokens) - 5))),
            ("tokenizer.ggml.cls_token_id", U32, 2), ("tokenizer.ggml.seperator_token_id", U32, 3),
            ("tokenizer.ggml.unknown_token_id", U32, 1), ("tokenizer.ggml.padding_token_id", U32, 0)]


def model_tensors(n_embd=8, n_vocab=16, qtype="Q8_0", norms=("attn_norm", "ffn_norm"), tied=False, bias=False):
    t = [("token_embd.weight", "F32", [n_embd, n_vocab]), ("output_norm.weight", "F32", [n_embd])]
    if not tied:
        t.append(("output.weight", "F16", [n_embd, n_vocab]))
    t += [(f"blk.0.{n}.weight", "F32", [n_embd]) for n in norms]
    t += [("blk.0.attn_q.weight", qtype, [GGML[qtype][1], 1]), ("blk.0.attn_k.weight", "BF16", [n_embd, 4]),
          ("blk.0.attn_v.weight", "F32", [n_embd, 4]), ("blk.0.attn_output.weight", "F16", [n_embd, n_embd]),
          ("blk.0.ffn_up.weight", "Q4_0", [32, 1]), ("blk.0.ffn_down.weight", "F32", [16, n_embd])]
    if bias:
        t += [(f"blk.0.attn_{x}.bias", "F32", [4]) for x in "qkv"]
    return t


def gguf_seeds():
    seeds = {
        "llama-spm.gguf": write_gguf(arch_kv("llama", extra=[("llama.rope.dimension_count", U32, 4)]) + spm_vocab_kv(),
                                     model_tensors()),
        "qwen2-bpe.gguf": write_gguf(arch_kv("qwen2") + bpe_vocab_kv("qwen2"), model_tensors(bias=True)),
        "qwen3-bpe.gguf": write_gguf(arch_kv("qwen3", extra=[("qwen3.attention.key_length", U32, 4),
                                                             ("qwen3.attention.value_length", U32, 4)])
                                     + bpe_vocab_kv("qwen2"),
                                     model_tensors(norms=("attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm"))),
        "gemma3-spm.gguf": write_gguf(
            arch_kv("gemma3", extra=[("gemma3.attention.sliding_window", U32, 16),
                                     ("gemma3.rope.scaling.type", STRING, "linear"),
                                     ("gemma3.rope.scaling.factor", F32, 8.0)]) + spm_vocab_kv(),
            model_tensors(tied=True, qtype="Q4_K",
                          norms=("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm"))),
        "llama-bpe-v2.gguf": write_gguf(arch_kv("llama") + bpe_vocab_kv("llama-bpe"), model_tensors(), version=2),
        # YaRN keys (gpt-oss and Qwen long-context files) and LongRoPE factor tensors (Phi-3).
        "qwen3-yarn.gguf": write_gguf(
            arch_kv("qwen3", extra=[("qwen3.rope.scaling.type", STRING, "yarn"), ("qwen3.rope.scaling.factor", F32, 4.0),
                                    ("qwen3.rope.scaling.original_context_length", U32, 16),
                                    ("qwen3.rope.scaling.yarn_beta_fast", F32, 32.0),
                                    ("qwen3.rope.scaling.attn_factor", F32, 1.0)]) + bpe_vocab_kv("qwen2"),
            model_tensors(norms=("attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm"))),
        "phi3-longrope.gguf": write_gguf(
            arch_kv("phi3", extra=[("phi3.rope.dimension_count", U32, 4),
                                   ("phi3.rope.scaling.original_context_length", U32, 16),
                                   ("phi3.rope.scaling.attn_factor", F32, 1.2)]) + spm_vocab_kv(),
            model_tensors() + [("rope_factors_short.weight", "F32", [2]), ("rope_factors_long.weight", "F32", [2])]),
        "bert-vocab-only.gguf": write_gguf([("general.architecture", STRING, "bert")] + wordpiece_vocab_kv()),
        "nested-arrays.gguf": write_gguf([
            ("general.architecture", STRING, "llama"),
            ("x.nested", ARRAY, (ARRAY, [(I32, [1, 2, 3]), (STRING, ["a", "b"])])),
            ("x.ints", ARRAY, (U64, [0, 2**63, 2**64 - 1])), ("x.f64", F64, -0.0), ("x.i8", I8, -128),
            ("x.u16", U16, 65535), ("x.i16", I16, -1), ("x.i64", I64, -2**63), ("x.bool", BOOL, False)]),
    }
    # Real vocabularies, cut down.
    for name in ("llama-spm", "gpt-2", "bert-bge", "qwen2", "phi-3", "command-r"):
        src = SHARED / "tokenizer" / f"ggml-vocab-{name}.gguf"
        if src.exists():
            seeds[f"vocab-{name}.gguf"] = write_gguf(shrink_vocab_kv(read_gguf_kv(src)))
        else:
            print(f"make_corpus: {src} is missing; seed vocab-{name}.gguf skipped", file=sys.stderr)
    return seeds


# ---------------------------------------------------------------- safetensors

ST_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1}


def write_safetensors(tensors, metadata=None):
    """tensors: [(hf name, dtype, shape row-major)]."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape in tensors:
        n = ST_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((i * 13 + 7) % 256 for i in range(n))
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # safetensors pads the header with spaces
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    def layer(prefix, dtype, gemma=False):
        t = [(f"{prefix}layers.0.input_layernorm.weight", dtype, [8]),
             (f"{prefix}layers.0.post_attention_layernorm.weight", dtype, [8]),
             (f"{prefix}layers.0.self_attn.q_proj.weight", dtype, [8, 8]),
             (f"{prefix}layers.0.self_attn.k_proj.weight", dtype, [4, 8]),
             (f"{prefix}layers.0.self_attn.v_proj.weight", dtype, [4, 8]),
             (f"{prefix}layers.0.self_attn.o_proj.weight", dtype, [8, 8]),
             (f"{prefix}layers.0.mlp.gate_proj.weight", dtype, [16, 8]),
             (f"{prefix}layers.0.mlp.up_proj.weight", dtype, [16, 8]),
             (f"{prefix}layers.0.mlp.down_proj.weight", dtype, [8, 16])]
        if gemma:
            t += [(f"{prefix}layers.0.pre_feedforward_layernorm.weight", dtype, [8]),
                  (f"{prefix}layers.0.post_feedforward_layernorm.weight", dtype, [8]),
                  (f"{prefix}layers.0.self_attn.q_norm.weight", dtype, [4]),
                  (f"{prefix}layers.0.self_attn.k_norm.weight", dtype, [4])]
        return t

    return {
        "llama-f32.safetensors": write_safetensors(
            [("model.embed_tokens.weight", "F32", [16, 8]), ("model.norm.weight", "F32", [8]),
             ("lm_head.weight", "F32", [16, 8])] + layer("model.", "F32"), {"format": "pt"}),
        "qwen2-bf16-bias.safetensors": write_safetensors(
            [("model.embed_tokens.weight", "BF16", [16, 8]), ("model.norm.weight", "BF16", [8]),
             ("lm_head.weight", "BF16", [16, 8]), ("model.layers.0.self_attn.q_proj.bias", "BF16", [8]),
             ("model.layers.0.self_attn.k_proj.bias", "F16", [4]),
             ("model.layers.0.self_attn.v_proj.bias", "F32", [4])] + layer("model.", "BF16")),
        "gemma3-f16.safetensors": write_safetensors(
            [("model.language_model.embed_tokens.weight", "F16", [16, 8]),
             ("model.language_model.norm.weight", "F16", [8])] + layer("model.language_model.", "F16", gemma=True),
            {"format": "pt", "note": "tied"}),
        "legacy-prefix.safetensors": write_safetensors(
            [("language_model.model.embed_tokens.weight", "F32", [16, 8]),
             ("language_model.lm_head.weight", "F32", [16, 8]), ("vision_tower.unused", "F32", [2, 2, 2, 2]),
             ("language_model.model.layers.1.mlp.up_proj.weight", "BF16", [16, 8])]),
        "empty-header.safetensors": write_safetensors([]),
        # gpt-oss: stacked experts (x @ W), gate and up interleaved, stacked biases.
        "gptoss-bf16-experts.safetensors": write_safetensors(
            [("model.layers.0.mlp.router.weight", "F32", [4, 8]), ("model.layers.0.mlp.router.bias", "F32", [4]),
             ("model.layers.0.mlp.experts.gate_up_proj", "BF16", [4, 8, 32]),
             ("model.layers.0.mlp.experts.gate_up_proj_bias", "BF16", [4, 32]),
             ("model.layers.0.mlp.experts.down_proj", "F16", [4, 16, 8]),
             ("model.layers.0.mlp.experts.down_proj_bias", "F32", [4, 8]),
             ("model.layers.0.self_attn.sinks", "F32", [8])]),
        # gpt-oss checkpoints' MXFP4 experts: U8 blocks and e8m0 scales.
        "gptoss-mxfp4-experts.safetensors": write_safetensors(
            [("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", [2, 4, 1, 16]),
             ("model.layers.0.mlp.experts.gate_up_proj_scales", "U8", [2, 4, 1]),
             ("model.layers.0.mlp.experts.down_proj_blocks", "U8", [2, 2, 1, 16]),
             ("model.layers.0.mlp.experts.down_proj_scales", "U8", [2, 2, 1])]),
    }


# ---------------------------------------------------------------- tokenizer.json


def shrink_tokenizer_json(src, keep=KEEP_TOKENS, keep_added=16):
    j = json.loads(src.read_text(encoding="utf-8"))
    model = j["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < keep}
    model["vocab"] = vocab
    merges = []
    for m in model.get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    model["merges"] = merges
    # Added tokens past the cut get the ids right after it.
    added = []
    for k, a in enumerate(j.get("added_tokens", [])[:keep_added]):
        a = dict(a)
        if a["id"] >= keep:
            a["id"] = keep + k
        added.append(a)
    j["added_tokens"] = added
    # Template special tokens must name surviving ids.
    post = j.get("post_processor")
    if isinstance(post, dict) and "special_tokens" in post:
        for spec in post["special_tokens"].values():
            spec["ids"] = [i if i < keep else keep for i in spec["ids"]]
    return json.dumps(j, ensure_ascii=False, separators=(",", ":")).encode()


def tokenizer_json_seeds():
    seeds = {
        "wordpiece.json": json.dumps({
            "version": "1.0", "added_tokens": [{"id": i, "content": c, "special": True} for i, c in
                                               enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])],
            "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                           "strip_accents": None, "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}},
                                          {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                               "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                                                  "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100,
                      "vocab": {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world",
                                                             "##s", "he", "##llo", "a", "b", "1", "2"])}},
        }).encode(),
        "metaspace-bpe.json": json.dumps({
            "added_tokens": [{"id": 0, "content": "<unk>", "special": True},
                             {"id": 1, "content": "<s>", "special": True, "lstrip": True, "rstrip": True}],
            "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"},
                                                               {"type": "Strip", "left": True, "right": True}]},
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                              "split": True},
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
            "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"},
            "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
                      "vocab": {"<unk>": 0, "<s>": 1, "<0x41>": 2, "\u2581": 3, "h": 4, "e": 5, "he": 6,
                                "\u2581he": 7, "l": 8, "o": 9, "lo": 10},
                      "merges": [["h", "e"], ["\u2581", "he"], ["l", "o"]]},
        }, ensure_ascii=False).encode(),
        "digits-split.json": json.dumps({
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "Punctuation", "behavior": "Isolated"},
                {"type": "WhitespaceSplit"},
                {"type": "Split", "pattern": {"String": "-"}, "behavior": "Removed", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]},
            "model": {"vocab": {c: i for i, c in enumerate(byte_level_alphabet())}, "merges": ["a b"]},
        }, ensure_ascii=False).encode(),
    }
    for name in ("llama2", "llama3", "qwen3"):
        src = SHARED / "hf-tokenizers" / name / "tokenizer.json"
        if src.exists():
            seeds[f"{name}-cut.json"] = shrink_tokenizer_json(src)
        else:
            print(f"make_corpus: {src} is missing; seed {name}-cut.json skipped", file=sys.stderr)
    return seeds


# ---------------------------------------------------------------- request bodies

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <start_of_turn>"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": [{"type": "text", "text": "More"}]}]

REQUESTS = [
    {"model": "fuzz-model", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0},
    {"prompt": ["a", "b", "<s> c"], "n": 2, "best_of": 2, "seed": 7, "stop": ["\n", "."], "echo": True},
    {"prompt": [1, 5, 9, 300], "max_tokens": 4, "logprobs": 3, "top_p": 0.9, "top_k": 40, "min_p": 0.05},
    {"prompt": [[1, 2], [3, 4, 5]], "stream": True, "stream_options": {"include_usage": True}},
    {"prompt": "x", "logit_bias": {"5": -100, "7": 2.5}, "presence_penalty": 0.5, "frequency_penalty": -0.5,
     "repetition_penalty": 1.1, "min_tokens": 2, "ignore_eos": True, "stop_token_ids": [2, 3],
     "skip_special_tokens": False, "include_stop_str_in_output": True, "priority": -3, "user": "u"},
    {"prompt": "x", "suffix": "", "add_special_tokens": False, "prompt_logprobs": None, "model": None},
    {"messages": MSGS, "max_completion_tokens": 8, "temperature": 0.7, "top_logprobs": 2, "logprobs": True},
    {"messages": MSGS[:2], "add_generation_prompt": False, "continue_final_message": True},
    {"messages": MSGS, "chat_template_kwargs": {"enable_thinking": False}, "tools": [], "tool_choice": "none"},
    {"messages": [{"role": "user", "content": None}], "response_format": {"type": "text"}, "stream": True},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}], "tool_choice": "auto"},
    {"messages": [{"role": "user", "content": "hi"}], "functions": [], "guided_json": {}},
    {"model": "/models/fuzz.gguf", "prompt": "\u00e9\u4f60\U0001F600", "max_tokens": 1000000},
    {"model": "other", "prompt": "x"},
    {"prompt": "", "max_tokens": 0, "n": 0, "temperature": -1, "top_p": 2, "logprobs": 99, "stop": [""]},
    {"prompt": [1e300], "max_tokens": 1.5, "seed": -1, "top_k": -1, "logit_bias": {"x": 1}},
    {"prompt": "x", "guided_regex": "(a|b)+[0-9]{2,3}", "guided_decoding_backend": "xgrammar"},
    {"prompt": "x", "structured_outputs": {"choice": ["yes", "no"], "disable_any_whitespace": True}},
    {"prompt": "x", "structured_outputs": {"grammar": "root ::= \"a\" b\nb ::= [0-9]*"}},
    {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"a": {"type": "array", "items": {"$ref": "#/$defs/p"}, "maxItems": 3}},
        "$defs": {"p": {"type": "string", "pattern": "^[a-z]+$"}}}}}},
    {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required", "parallel_tool_calls": False,
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {
         "type": "object", "properties": {"x": {"enum": [1, "a", None]}}}}}]},
    # Responses API and Messages API bodies (the target parses every body as each API)
    {"input": [{"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
               {"role": "user", "content": "Hi"},
               {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
               {"type": "function_call_output", "call_id": "c1", "output": "ok"}, {"type": "reasoning"}],
     "instructions": "I", "max_output_tokens": 8, "store": False,
     "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"x": {}}}}],
     "tool_choice": {"type": "function", "name": "f"}, "text": {"format": {"type": "json_object"}}},
    {"max_tokens": 8, "system": [{"type": "text", "text": "S"}], "stop_sequences": ["."], "top_k": 3,
     "messages": [{"role": "user", "content": "weather?"},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "sun"}]}],
     "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"},
     "thinking": {"type": "enabled", "budget_tokens": 1024}},
    # Rerank and score bodies (vLLM's /v1/rerank and /v1/score)
    {"model": "fuzz-model", "query": "capital of France?", "documents": ["Paris.", {"text": "{query} <s>"}],
     "top_n": 1, "return_documents": False},
    {"text_1": ["a", "b"], "text_2": ["c", "\u00e9{document}"]},
]


def request_seeds():
    seeds = {f"body-{i:02d}.json": json.dumps(b, ensure_ascii=False).encode() for i, b in enumerate(REQUESTS)}
    seeds["not-an-object.json"] = b"[1, 2, 3]"
    seeds["deep-nesting.json"] = b'{"prompt": ' + b"[" * 64 + b"1" + b"]" * 64 + b"}"
    return seeds


# ---------------------------------------------------------------- chat templates


def chat_template_seeds():
    seeds = {}
    cases = json.loads((FIXTURES / "chat_templates" / "language.json").read_text(encoding="utf-8"))["cases"]
    per_group = {}
    for c in cases:
        # Hundreds of whitespace cases differ little: a few of each group suffice.
        group = re.sub(r"_?\d+$", "", c["name"])
        per_group[group] = per_group.get(group, 0) + 1
        if per_group[group] <= (3 if group.startswith("ws_") else 1):
            seeds[f"lang-{c['name']}.jinja"] = c["template"].encode()
    for p in sorted((FIXTURES / "chat_templates" / "extra").glob("*.jinja")):
        seeds[f"model-{p.name}"] = p.read_bytes()
    shared = SHARED / "chat-templates"
    if shared.exists():
        seen = set(seeds.values())
        for p in sorted(shared.glob("*.jinja")):
            if p.read_bytes() not in seen:  # several models share one template
                seeds[f"model-{p.name}"] = p.read_bytes()
                seen.add(p.read_bytes())
    else:
        print(f"make_corpus: {shared} is missing; its templates are skipped", file=sys.stderr)
    return seeds


def grammar_seeds():
    """One byte of kind (0 JSON schema, 1 regex, 2 EBNF, 3 choices, 4 structural tag), then the text."""
    kinds = {"json": 0, "regex": 1, "ebnf": 2, "choice": 3, "tag": 4}
    specs = {
        "json_object": ("json", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                                  "age": {"type": "integer", "minimum": 0}},
                                 "required": ["name"]}),
        "json_array": ("json", {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 4}),
        "json_refs": ("json", {"$defs": {"n": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/n"}]}},
                               "$ref": "#/$defs/n"}),
        "json_pattern": ("json", {"type": "string", "pattern": "^[a-z]{2,5}$", "format": "email"}),
        "regex": ("regex", "[a-z]+@[a-z]+\\.(com|org){1,2}"),
        "regex_empty": ("regex", "[^\\s\\S]"),
        "ebnf": ("ebnf", 'root ::= item ("," item)*\nitem ::= [0-9]+ | "x"{2,3}'),
        "ebnf_recursive": ("ebnf", 'root ::= "(" root ")" | ""'),
        "choice": ("choice", ["yes", "no", "say \"maybe\""]),
        "tag": ("tag", {"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}}),
    }
    out = {}
    for name, (kind, spec) in specs.items():
        text = spec if isinstance(spec, str) else json.dumps(spec)
        out[name] = bytes([kinds[kind]]) + text.encode()
    return out


def main():
    targets = {"gguf": gguf_seeds(), "safetensors": safetensors_seeds(), "tokenizer_json": tokenizer_json_seeds(),
               "request": request_seeds(), "chat_template": chat_template_seeds(), "grammar": grammar_seeds()}
    total = 0
    for target, seeds in targets.items():
        out = CORPUS / target
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name, data in sorted(seeds.items()):
            (out / name).write_bytes(data)
            total += len(data)
        print(f"{target}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
