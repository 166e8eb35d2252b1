"""Devices end to end: `--device opencl` (the plugin in build/backends, on
PoCL in CI) and `--device cscalar` (the plain C11 test plugin of
tests/plugins/c_scalar) serve the same greedy text as the CPU, swap preemption works
there and shows in /metrics, and devices that are missing or misused give
one clear error line."""
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import requests

from conftest import BIN, STORIES, Server, model_name
import prom
from test_cli_errors import assert_one_line_error, run

PLUGIN = BIN.parent / "backends" / "libpagellm_backend_opencl.so"
TEST_PLUGINS = BIN.parent / "test-plugins"
CSCALAR = TEST_PLUGINS / "libpagellm_backend_cscalar.so"
GREEDY_START = ", there was a little girl named Lily. She loved to play outside in the park."


def opencl_device_present():
    if not PLUGIN.exists():
        return False
    code, _, err = run(str(BIN), "generate", "-m", str(STORIES), "-p", "a", "-n", "1", "--device", "opencl",
                       "--kv-cache-memory", "4MiB")
    return code == 0


needs_opencl = pytest.mark.skipif(not opencl_device_present(), reason="no OpenCL plugin or device here")


@pytest.fixture(scope="module")
def opencl_server():
    # A KV pool of 14 blocks of 16 tokens (10 KiB each): 8 concurrent stories of ~65 tokens overflow it.
    s = Server(["--device", "opencl", "--preemption-mode", "swap", "--swap-space", "0.01",
                "--kv-cache-memory", "150KiB", "--max-model-len", "128", "--max-num-seqs", "16"]).start()
    yield s
    code = s.stop()
    assert code == 0, s.output()


@needs_opencl
def test_opencl_greedy_matches_cpu_and_streams(opencl_server):
    body = {"model": model_name(opencl_server), "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
    r = requests.post(opencl_server.url("/v1/completions"), json=body, timeout=60)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert GREEDY_START.startswith(text), text
    with requests.post(opencl_server.url("/v1/completions"), json={**body, "stream": True}, stream=True,
                       timeout=60) as s:
        chunks = [line for line in s.iter_lines() if line.startswith(b"data: {")]
    assert len(chunks) >= 16


@needs_opencl
def test_opencl_swap_preemption_keeps_outputs_and_counts(opencl_server):
    from concurrent.futures import ThreadPoolExecutor

    prompts = ["Once upon a time", "The little dog", "Lily and Ben", "One day, a bird"] * 2
    body = lambda p: {"model": model_name(opencl_server), "prompt": p, "max_tokens": 60, "temperature": 0,
                      "ignore_eos": True}

    def complete(p):
        r = requests.post(opencl_server.url("/v1/completions"), json=body(p), timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(complete, prompts))
    alone = {p: complete(p) for p in set(prompts)}
    for p, t in zip(prompts, together):
        assert t == alone[p], p
    m = prom.parse(requests.get(opencl_server.url("/metrics"), timeout=10).text)
    assert prom.value(m, "pagellm:preemptions_by_mode_total", mode="swap") > 0, opencl_server.output()[-2000:]
    assert prom.value(m, "pagellm:kv_swapped_bytes_total", direction="out") > 0


@pytest.mark.skipif(not CSCALAR.exists(), reason="the C test plugin is not built (PAGELLM_BUILD_TESTS off)")
def test_plain_c_plugin_greedy_matches_cpu(pagellm_bin, stories_model):
    # As for OpenCL: the greedy text of the CPU (here with float matmuls, as the plugin multiplies).
    args = ["generate", "-m", stories_model, "-p", "Once upon a time", "-n", "24", "--temp", "0"]
    code, plugin_out, err = run(pagellm_bin, *args, "--device", "cscalar", "--backend-plugin", str(CSCALAR))
    assert code == 0, err
    assert "cscalar" in err
    code, cpu_out, err = run(pagellm_bin, *args, "--exact-matmul")
    assert code == 0, err
    assert plugin_out == cpu_out
    assert plugin_out.startswith(GREEDY_START[:40]), plugin_out


@pytest.mark.skipif(not CSCALAR.exists(), reason="the test plugins are not built (PAGELLM_BUILD_TESTS off)")
def test_plugins_of_the_old_abi_are_refused(pagellm_bin, stories_model):
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1",
                       "--backend-plugin", str(TEST_PLUGINS / "libpagellm_backend_v1.so"))
    assert_one_line_error(code, err, "was built against backend ABI v1 (a C++ pagellm::Backend)")
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1",
                       "--backend-plugin", str(TEST_PLUGINS / "libpagellm_backend_cscalar_bad_abi.so"))
    assert_one_line_error(code, err, "was built for backend ABI version 1002")


def test_missing_backends_say_so(pagellm_bin, stories_model):
    env = dict(os.environ, PAGELLM_PLUGIN_DIR="/nonexistent-plugins")
    p = subprocess.run([pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1", "--device", "opencl"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert_one_line_error(p.returncode, p.stderr, "pagellm was built without OpenCL support")
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1", "--device", "tpu:0")
    assert_one_line_error(code, err, "unknown device 'tpu'")
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1", "--device", "cpu:x")
    assert_one_line_error(code, err, "device index")


def test_bad_plugins_and_options_are_refused(pagellm_bin, stories_model):
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1",
                       "--backend-plugin", "/nonexistent/libx.so")
    assert_one_line_error(code, err, "does not exist")
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(b"not a library")
        f.flush()
        code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1",
                           "--backend-plugin", f.name)
    assert_one_line_error(code, err, "cannot load backend plugin")
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1",
                       "--backend-option", "threads")
    assert_one_line_error(code, err, "KEY=VALUE")
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1",
                       "--backend-option", "colour=blue")
    assert_one_line_error(code, err, "no option 'colour'")
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1",
                       "--preemption-mode", "swap")
    assert_one_line_error(code, err, "--preemption-mode swap needs a backend")
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1",
                       "--gpu-memory-utilization", "1.5")
    assert code != 0 and "gpu-memory-utilization" in err


def test_gpu_memory_utilization_sizes_the_kv_cache(pagellm_bin, stories_model):
    # On host memory the fraction is of all RAM: a tiny one leaves no room.
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "a", "-n", "1",
                       "--gpu-memory-utilization", "0.000001")
    assert_one_line_error(code, err, "leaves no room for the KV cache")
    code, out, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "Once upon a time", "-n", "8",
                         "--temp", "0", "--gpu-memory-utilization", "0.05")
    assert code == 0, err


def test_info_lists_devices(pagellm_bin):
    code, out, err = run(pagellm_bin, "info", "--devices")
    assert code == 0, err
    assert "device cpu (built in" in out
    assert "; 1 device): " in out
    if PLUGIN.exists():
        assert "device opencl (" + str(PLUGIN) in out


def test_no_repack_multiplies_from_the_file_rows(pagellm_bin, default_model):
    # The default repacks every quantized matrix for the SIMD kernels and says how much it
    # holds; --no-repack keeps the file's rows (and the same start of the greedy text).
    args = ["generate", "-m", default_model, "-p", "The capital of France is", "-n", "6", "--temp", "0"]
    code, packed_out, err = run(pagellm_bin, *args)
    assert code == 0, err
    assert "of weights repacked at load" in err, err
    code, rows_out, err = run(pagellm_bin, *args, "--no-repack")
    assert code == 0, err
    assert "weights not repacked (--no-repack)" in err and "repacked at load" not in err, err
    assert rows_out.split()[:3] == packed_out.split()[:3], (rows_out, packed_out)
    code, _, err = run(pagellm_bin, *args, "--backend-option", "repack=perhaps")
    assert_one_line_error(code, err, "cpu backend option repack='perhaps' is not a boolean")
