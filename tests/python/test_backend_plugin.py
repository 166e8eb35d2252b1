"""A backend plugin loaded by the Python module: the plain C11 test backend
(tests/plugins/c_scalar, device cscalar) needs no symbol of pagellm's, so
the extension module loads it as the executable does, and it serves the
CPU's greedy tokens (float matmuls)."""

import os
from pathlib import Path

import pytest

from conftest import REPO
from pagellm import LLM, SamplingParams

BUILD = Path(os.environ.get("PAGELLM_BUILD_DIR", REPO / "build"))
PLUGIN = BUILD / "test-plugins" / "libpagellm_backend_cscalar.so"
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = ["Once upon a time", "The little dog"]


@pytest.mark.skipif(not PLUGIN.exists(), reason=f"the C test plugin is not built ({PLUGIN})")
def test_plain_c_plugin_serves_the_cpus_greedy_tokens(stories_path):
    dev = LLM(model=stories_path, device="cscalar", backend_plugins=[str(PLUGIN)], max_model_len=128)
    cpu = LLM(model=stories_path, exact_matmul=True, num_threads=1, max_model_len=128)
    got = [o.outputs[0].token_ids for o in dev.generate(PROMPTS, GREEDY, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in cpu.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert got == want
    assert all(len(ids) == 24 for ids in got)


@pytest.mark.skipif(not PLUGIN.exists(), reason=f"the test plugins are not built ({PLUGIN})")
def test_plugin_of_the_old_abi_is_refused(stories_path):
    with pytest.raises(Exception, match="built against backend ABI v1"):
        LLM(model=stories_path, device="cscalar", backend_plugins=[str(PLUGIN.parent / "libpagellm_backend_v1.so")])


OPENCL = BUILD / "backends" / "libpagellm_backend_opencl.so"


def _opencl_llm(stories_path):
    if not OPENCL.exists():
        pytest.skip(f"the OpenCL plugin is not built ({OPENCL})")
    try:
        return LLM(model=stories_path, device="opencl", backend_plugins=[str(OPENCL)], max_model_len=128,
                   kv_cache_memory="4MiB")
    except Exception as e:  # no ICD or no device here
        if "OpenCL" in str(e) or "no device" in str(e):
            pytest.skip(str(e))
        raise


def test_opencl_plugin_loads_in_the_module(stories_path):
    # The C++ OpenCL backend carries its own copy of the core code it uses:
    # it loads where no pagellm symbol is exported (this module).
    dev = _opencl_llm(stories_path)
    cpu = LLM(model=stories_path, exact_matmul=True, num_threads=1, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    got = dev.generate(PROMPTS[:1], params, use_tqdm=False)[0].outputs[0].token_ids
    want = cpu.generate(PROMPTS[:1], params, use_tqdm=False)[0].outputs[0].token_ids
    assert got == want
