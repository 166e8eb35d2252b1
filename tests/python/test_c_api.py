"""The C API from another language (Python's ctypes on libpagellm.so), and the
C example built against an installed copy through pkg-config."""

import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

BUILD = Path(os.environ.get("PAGELLM_BUILD_DIR", REPO / "build"))
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
OK, TIMEOUT, INVALID = 0, 1, -1


@pytest.fixture(scope="module")
def lib():
    path = BUILD / "libpagellm.so"
    if not path.exists():
        pytest.skip(f"missing {path} (make build)")
    lib = ctypes.CDLL(str(path))
    lib.pagellm_last_error.restype = ctypes.c_char_p
    lib.pagellm_version.restype = ctypes.c_char_p
    lib.pagellm_output_request_id.restype = ctypes.c_char_p
    lib.pagellm_output_finish_reason.restype = ctypes.c_char_p
    lib.pagellm_output_text.restype = ctypes.c_void_p
    lib.pagellm_output_token_ids.restype = ctypes.POINTER(ctypes.c_int32)
    for name in ("pagellm_output_text", "pagellm_output_token_ids", "pagellm_output_finish_reason",
                 "pagellm_output_finished", "pagellm_output_request_id", "pagellm_output_free",
                 "pagellm_num_unfinished", "pagellm_engine_destroy"):
        getattr(lib, name).argtypes = None
    return lib


@pytest.fixture(scope="module")
def engine(lib, stories_path):
    e = ctypes.c_void_p()
    assert lib.pagellm_engine_create(stories_path.encode(), b'{"max_model_len": 256, "num_threads": 1}',
                                     ctypes.byref(e)) == OK
    yield e
    lib.pagellm_engine_destroy(e)


def read(lib, out):
    """(text, token ids, finish reason) of completion 0 of an output."""
    out = ctypes.c_void_p(out)
    n, length = ctypes.c_size_t(), ctypes.c_size_t()
    text = ctypes.string_at(lib.pagellm_output_text(out, ctypes.c_size_t(0), ctypes.byref(length)), length.value)
    ids = lib.pagellm_output_token_ids(out, ctypes.c_size_t(0), ctypes.byref(n))
    reason = lib.pagellm_output_finish_reason(out, ctypes.c_size_t(0))
    return text.decode(), [ids[i] for i in range(n.value)], reason and reason.decode()


def test_version(lib):
    assert lib.pagellm_abi_version() == 1
    assert lib.pagellm_version().decode().count(".") == 2


def test_generate_streams_through_a_callback(lib, engine, llm):
    from pagellm import SamplingParams
    deltas = []

    @CALLBACK
    def on_output(out, user):
        deltas.append(read(lib, out))
        return 0

    assert lib.pagellm_generate(engine, b"Once upon a time", None, ctypes.c_size_t(0),
                                b'{"temperature": 0, "max_tokens": 20, "ignore_eos": true}', on_output, None) == OK
    assert len(deltas) > 1 and deltas[-1][2] == "length"
    expected = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0]
    assert "".join(d[0] for d in deltas) == expected.text
    assert sum((d[1] for d in deltas), []) == expected.token_ids


def test_poll_and_abort(lib, engine):
    ids = (ctypes.c_int32 * 3)(1, 403, 407)
    assert lib.pagellm_add_request(engine, b"r1", None, ids, ctypes.c_size_t(3),
                                   b'{"max_tokens": 200, "ignore_eos": true}') == OK
    reasons, outputs = [], 0
    while True:
        out = ctypes.c_void_p()
        assert lib.pagellm_next_output(engine, 10000, ctypes.byref(out)) == OK
        outputs += 1
        if outputs == 1:
            assert lib.pagellm_abort(engine, b"r1") == OK
        assert lib.pagellm_output_request_id(out) == b"r1"
        reasons.append(read(lib, out.value)[2])
        done = lib.pagellm_output_finished(out)
        lib.pagellm_output_free(out)
        if done:
            break
    assert reasons[-1] == "abort"
    out = ctypes.c_void_p()
    assert lib.pagellm_next_output(engine, 10, ctypes.byref(out)) == TIMEOUT


def test_errors(lib, engine):
    assert lib.pagellm_add_request(engine, b"bad", b"x", None, ctypes.c_size_t(0), b'{"top_p": 7}') == INVALID
    assert b"top_p" in lib.pagellm_last_error()
    # Strings must be UTF-8: a Latin-1 prompt, an id with a character cut short.
    assert lib.pagellm_add_request(engine, b"bad", "caf\u00e9".encode("latin-1"), None, ctypes.c_size_t(0),
                                   None) == INVALID
    assert b"'prompt' is not valid UTF-8 (bad byte 0xE9 at offset 3)" in lib.pagellm_last_error()
    assert lib.pagellm_add_request(engine, b"id-\xc3", b"x", None, ctypes.c_size_t(0), None) == INVALID
    assert b"'request_id' is not valid UTF-8" in lib.pagellm_last_error()
    assert lib.pagellm_num_unfinished(engine) == 0
    e = ctypes.c_void_p()
    assert lib.pagellm_engine_create(b"/nonexistent.gguf", None, ctypes.byref(e)) == -2
    assert e.value is None


def test_embed(lib, engine, llm):
    """pagellm_embed: the vector LLM.embed gives for the same prompt (last token, normalised)."""
    dim = ctypes.c_size_t()
    n = lib.pagellm_engine_embedding_size(engine)
    assert n > 0
    small = (ctypes.c_float * 4)()
    assert lib.pagellm_embed(engine, b"Once upon a time", None, ctypes.c_size_t(0), small, ctypes.c_size_t(4),
                             ctypes.byref(dim)) == -5
    assert dim.value == n
    vec = (ctypes.c_float * n)()
    assert lib.pagellm_embed(engine, b"Once upon a time", None, ctypes.c_size_t(0), vec, ctypes.c_size_t(n),
                             ctypes.byref(dim)) == OK
    want = llm.embed("Once upon a time")[0].outputs.embedding
    assert max(abs(a - b) for a, b in zip(vec, want)) < 1e-5
    assert abs(sum(x * x for x in vec) - 1) < 1e-4
    ids = (ctypes.c_int32 * 2)(1, 10 ** 6)
    assert lib.pagellm_embed(engine, None, ids, ctypes.c_size_t(2), vec, ctypes.c_size_t(n),
                             ctypes.byref(dim)) == INVALID
    assert b"vocabulary" in lib.pagellm_last_error()
    assert lib.pagellm_num_unfinished(engine) == 0


def test_score(lib, engine):
    """pagellm_score: the tiny reranker's scores (tests/fixtures/hf/rerank-tiny-qwen3.json: transformers'
    sigmoid(l_yes - l_no) on llama.cpp's converted GGUF); a model without a score head is refused."""
    ref = json.loads((REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.json").read_text())
    e = ctypes.c_void_p()
    gguf = REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.gguf"
    assert lib.pagellm_engine_create(str(gguf).encode(), b'{"task": "score", "num_threads": 1, "max_model_len": 256, '
                                     b'"kv_cache_dtype": "f32"}', ctypes.byref(e)) == OK
    score = ctypes.c_float()
    try:
        for doc, want in zip(ref["documents"], ref["scores"]):
            assert lib.pagellm_score(e, ref["query"].encode(), doc.encode(), ctypes.byref(score)) == OK
            assert abs(score.value - want) < 1e-4
        assert lib.pagellm_score(e, b"q", "caf\u00e9".encode("latin-1"), ctypes.byref(score)) == INVALID
        assert b"'document' is not valid UTF-8" in lib.pagellm_last_error()
    finally:
        lib.pagellm_engine_destroy(e)
    assert lib.pagellm_score(engine, b"q", b"d", ctypes.byref(score)) == INVALID  # stories has no score head
    assert lib.pagellm_num_unfinished(engine) == 0


def test_c_example_through_pkg_config(tmp_path, stories_path):
    if not shutil.which("cc") or not shutil.which("pkg-config"):
        pytest.skip("needs cc and pkg-config")
    if not (BUILD / "libpagellm.so").exists():
        pytest.skip("make build first")
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix), "--component", "c"], check=True,
                   capture_output=True)
    pc_dirs = [str(p.parent) for p in prefix.rglob("pagellm.pc")]
    assert pc_dirs, "the install has no pagellm.pc"
    env = dict(os.environ, PKG_CONFIG_PATH=":".join(pc_dirs))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "pagellm"], env=env, check=True, capture_output=True,
                           text=True).stdout.split()
    libdir = next(f[2:] for f in flags if f.startswith("-L"))
    exe = tmp_path / "generate"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", str(REPO / "examples/c/generate.c"), "-o", str(exe), *flags,
                    f"-Wl,-rpath,{libdir}"], check=True)
    out = subprocess.run([str(exe), stories_path, "Once upon a time"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) > 10
