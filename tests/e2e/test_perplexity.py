"""`pagellm perplexity` against llama.cpp's llama-perplexity on the same text and
settings (tests/fixtures/perplexity/llamacpp.json, tools/gen_perplexity_fixtures.py).
stories260K (f32 weights) agrees to 0.05%; the Q4_K_M default model within 1%
(the two engines round activations differently in quantized matrix products)."""

import json
import math
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


def test_streaming_through_a_sliding_window_stays_bounded(tmp_path):
    """--kv-eviction sliding: the whole text (~350 windows of 64 tokens) as one
    stream. stories260K's context is 512, so no sinks here (a sink's RoPE
    distance would pass what it was trained on). Every segment is reported,
    and over the whole text and over its last third the stream stays within
    1.5x of scoring fixed 64-token chunks (half a chunk of context each)."""
    if not STORIES.exists():
        pytest.skip(f"missing test data: {STORIES}")
    records = {}
    for name, extra in (("chunks", []), ("stream", ["--kv-eviction", "sliding", "--attention-sinks", "0"])):
        path = tmp_path / f"{name}.json"
        out = subprocess.run([str(BIN), "perplexity", "-m", str(STORIES), "-f", CASES["stories260K"]["text"],
                              "--ctx", "64", "--output-json", str(path), *extra],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        records[name] = json.loads(path.read_text())
    stream, chunks = records["stream"], records["chunks"]
    segments = stream["segment_ppl"]
    assert len(segments) == (stream["tokens"] - 1 + 63) // 64
    assert stream["ppl"] < 1.5 * chunks["ppl"]
    # The last third: geometric mean of the stream's segments; the chunks'
    # running perplexity (32 scored tokens per chunk) gives theirs.
    k = len(segments) * 2 // 3
    tail_stream = math.exp(sum(math.log(x) for x in segments[k:-1]) / len(segments[k:-1]))
    running = chunks["running_ppl"]
    n, m = len(running), len(running) * 2 // 3
    tail_chunks = math.exp((n * math.log(running[-1]) - m * math.log(running[m - 1])) / (n - m))
    assert tail_stream < 1.5 * tail_chunks
