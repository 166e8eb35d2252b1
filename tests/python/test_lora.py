"""LoRA adapters from Python (vLLM's LLM(enable_lora=True) and LoRARequest)
and from C (pagellm_load_lora_adapter, "lora" in sampling_json), against
the greedy continuations transformers + peft computed for the fixture
adapters on the tiny Llama dummy (tests/fixtures/lora/tiny-llama)."""

import ctypes
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO

FIXTURES = REPO / "tests" / "fixtures" / "lora" / "tiny-llama"
BUILD = Path(os.environ.get("PAGELLM_BUILD_DIR", REPO / "build"))
REF = json.loads((FIXTURES / "expected.json").read_text())
PROMPT = REF["greedy"]["prompt"]


def want(case):
    return REF["cases"][case]["greedy_ids"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN}")
    d = tmp_path_factory.mktemp("lora")
    make = [str(BIN), "make-dummy", "--shape", "tiny-llama", "--seed", str(REF["seed"]), "-t", "1"]
    subprocess.run([*make, "--format", "hf", "--type", "f32", "-o", str(d / "base")], check=True, capture_output=True)
    subprocess.run([*make, "--type", "q8_0", "-o", str(d / "vocab.gguf")], check=True, capture_output=True)
    return d


ARGS = {"num_threads": 1, "max_model_len": 128, "kv_cache_dtype": "f32", "enable_lora": True, "max_loras": 2,
        "max_lora_rank": 16}


def test_llm_generate_with_lora_requests(base):
    from pagellm import LLM, LoRARequest, SamplingParams
    from pagellm.lora.request import LoRARequest as FromVllmPath
    assert FromVllmPath is LoRARequest
    llm = LLM(model=str(base / "base"), tokenizer=str(base / "vocab.gguf"), **ARGS)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = {"prompt_token_ids": PROMPT}
    a, b, c = (LoRARequest(f"ad-{x}", i + 1, str(FIXTURES / x)) for i, x in enumerate("abc"))
    # One adapter for the whole batch, then a batch mixing three adapters and the base.
    assert llm.generate([prompt], sp, use_tqdm=False, lora_request=a)[0].outputs[0].token_ids == want("a")
    outs = llm.generate([prompt] * 4, sp, use_tqdm=False, lora_request=[None, a, b, c])
    assert [o.outputs[0].token_ids for o in outs] == [want("base"), want("a"), want("b"), want("c")]
    with pytest.raises(ValueError, match="loaded from"):
        llm.generate([prompt], sp, use_tqdm=False, lora_request=LoRARequest("ad-a", 1, str(FIXTURES / "b")))
    with pytest.raises(ValueError, match="2 LoRA requests for 1 prompts"):
        llm.generate([prompt], sp, use_tqdm=False, lora_request=[a, b])


def test_llm_without_enable_lora_refuses(base):
    from pagellm import LLM, LoRARequest, SamplingParams
    args = dict(ARGS, enable_lora=False)
    llm = LLM(model=str(base / "base"), tokenizer=str(base / "vocab.gguf"), **args)
    with pytest.raises(Exception, match="enable_lora"):
        llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=2), use_tqdm=False,
                     lora_request=LoRARequest("ad-a", 1, str(FIXTURES / "a")))


def test_c_api_loads_and_selects_adapters(base):
    path = BUILD / "libpagellm.so"
    if not path.exists():
        pytest.skip(f"missing {path} (make build)")
    lib = ctypes.CDLL(str(path))
    lib.pagellm_last_error.restype = ctypes.c_char_p
    lib.pagellm_output_token_ids.restype = ctypes.POINTER(ctypes.c_int32)
    e = ctypes.c_void_p()
    opts = dict(ARGS, tokenizer=str(base / "vocab.gguf"))
    assert lib.pagellm_engine_create(str(base / "base").encode(), json.dumps(opts).encode(), ctypes.byref(e)) == 0, \
        lib.pagellm_last_error()
    try:
        assert lib.pagellm_load_lora_adapter(e, b"ad-c", str(FIXTURES / "c").encode()) == 0, lib.pagellm_last_error()
        assert lib.pagellm_load_lora_adapter(e, b"ad-c", str(FIXTURES / "c").encode()) == -1
        assert b"already loaded" in lib.pagellm_last_error()
        assert lib.pagellm_load_lora_adapter(e, b"ad-x", b"/nonexistent") == -1
        ids = (ctypes.c_int32 * len(PROMPT))(*PROMPT)
        sampling = json.dumps({"temperature": 0, "max_tokens": 8, "ignore_eos": True, "lora": "ad-c"}).encode()
        assert lib.pagellm_add_request(e, b"r", None, ids, ctypes.c_size_t(len(PROMPT)), sampling) == 0
        got = []
        while True:
            out = ctypes.c_void_p()
            assert lib.pagellm_next_output(e, 30000, ctypes.byref(out)) == 0
            n = ctypes.c_size_t()
            p = lib.pagellm_output_token_ids(out, ctypes.c_size_t(0), ctypes.byref(n))
            got += [p[i] for i in range(n.value)]
            done = lib.pagellm_output_finished(out)
            lib.pagellm_output_free(out)
            if done:
                break
        assert got == want("c")
        assert lib.pagellm_unload_lora_adapter(e, b"ad-c") == 0
        assert lib.pagellm_unload_lora_adapter(e, b"ad-c") == -1
    finally:
        lib.pagellm_engine_destroy(e)
