"""`pagellm perplexity` against llama.cpp's llama-perplexity on the same text and
settings (tests/fixtures/perplexity/llamacpp.json, tools/gen_perplexity_fixtures.py).
stories260K (f32 weights) agrees to 0.05%; the Q4_K_M default model within 1%
(the two engines round activations differently in quantized matrix products)."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO, STORIES, default_model_path

CASES = {c["name"]: c for c in json.loads((REPO / "tests/fixtures/perplexity/llamacpp.json").read_text())["cases"]}


def perplexity(model, case, *extra):
    if not Path(case["text"]).exists():
        pytest.skip(f"missing {case['text']}")
    out = subprocess.run([str(BIN), "perplexity", "-m", str(model), "-f", case["text"], "--ctx", str(case["ctx"]),
                          *extra], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return float(re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout).group(1))


def test_stories_matches_llama_cpp():
    if not STORIES.exists():
        pytest.skip(f"missing test data: {STORIES}")
    case = CASES["stories260K"]
    assert perplexity(STORIES, case) == pytest.approx(case["ppl"], rel=5e-4)


def test_default_model_matches_llama_cpp():
    model = default_model_path()
    if model is None:
        pytest.skip("the default model is not installed (make setup)")
    case = CASES["gemma3-270m-q4_k_m"]
    assert perplexity(model, case) == pytest.approx(case["ppl"], rel=1e-2)


def test_bad_input_is_a_clear_error(tmp_path):
    if not STORIES.exists():
        pytest.skip(f"missing test data: {STORIES}")
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time.")
    out = subprocess.run([str(BIN), "perplexity", "-m", str(STORIES), "-f", str(short), "--ctx", "128"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "fewer than one chunk" in out.stderr
    out = subprocess.run([str(BIN), "perplexity", "-m", str(STORIES), "-f", str(tmp_path / "missing.txt")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "cannot open" in out.stderr


def test_int8_kv_cache_stays_within_one_percent_of_fp16():
    """--kv-cache-dtype int8 on the default model (docs/performance.md: +0.6%
    over all 14 chunks); the first 4 chunks here, against fp16 in the same run."""
    model = default_model_path()
    if model is None:
        pytest.skip("the default model is not installed (make setup)")
    case = CASES["gemma3-270m-q4_k_m"]
    fp16 = perplexity(model, case, "--chunks", "4", "--kv-cache-dtype", "fp16")
    int8 = perplexity(model, case, "--chunks", "4", "--kv-cache-dtype", "int8")
    assert int8 == pytest.approx(fp16, rel=1e-2)
