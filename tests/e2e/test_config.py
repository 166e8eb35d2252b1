"""--config FILE.yaml (every flag readable from YAML, the command line wins),
--scheduling-preset, --preemption-policy and --metrics-prefix."""

import subprocess

import pytest
import requests

from conftest import BIN, STORIES, Server, code_block


def generate(*args):
    return subprocess.run([str(BIN), "generate", "-m", str(STORIES), "-p", "Once", "-n", "4", "-t", "1", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(autouse=True)
def need_model():
    if not STORIES.exists():
        pytest.skip(f"missing test data: {STORIES}")


def test_yaml_values_apply_and_the_command_line_wins(tmp_path):
    cfg = tmp_path / "engine.yaml"
    cfg.write_text("block-size: 5\nmax_num_seqs: 3\n")
    bad = generate("--config", str(cfg))
    assert bad.returncode != 0 and "block-size" in bad.stderr and "5 not in" in bad.stderr
    good = generate("--config", str(cfg), "--block-size", "16")
    assert good.returncode == 0, good.stderr
    # max_num_seqs 3 from the file sizes the KV cache for 3 full-length sequences.
    assert "KV cache 95 blocks" in good.stderr


def test_nested_values_lists_and_presets(tmp_path):
    cfg = tmp_path / "engine.yaml"
    cfg.write_text("scheduling-preset: latency\npreemption-policy: conservative\nstop: [zzz, yyy]\n"
                   "speculative-config:\n  method: ngram\n  num_speculative_tokens: 3\n")
    out = generate("--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "ngram speculation: 3 tokens" in out.stderr


@pytest.mark.parametrize("text, message", [
    ("max-num-seqs: [3\n", "not valid YAML"),
    ("no-such-flag: 1\n", "'no-such-flag' is not a flag"),
    ("- a\n- b\n", "mapping"),
])
def test_bad_files_are_clear_errors(tmp_path, text, message):
    cfg = tmp_path / "engine.yaml"
    cfg.write_text(text)
    out = generate("--config", str(cfg))
    assert out.returncode != 0 and message in out.stderr, out.stderr
    missing = generate("--config", str(tmp_path / "missing.yaml"))
    assert missing.returncode != 0 and "cannot open" in missing.stderr


def test_serve_from_yaml_with_vllm_metric_names(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("metrics-prefix: both\nscheduling-preset: throughput\nthreads: 1\n")
    s = Server(["--config", str(cfg)]).start()
    try:
        r = requests.post(s.url("/v1/completions"), json={"prompt": "Once", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200
        text = requests.get(s.url("/metrics"), timeout=10).text
    finally:
        s.stop()
    for name in ("vllm:num_requests_running", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds",
                 "pagellm:num_requests_running", "vllm:scheduler_seconds_count", "vllm:batch_fill_ratio_count",
                 'vllm:preemptions_by_cause_total{model_name="stories260K",cause="priority"}'):
        assert name in text, name


def test_readme_yaml_example(tmp_path):
    import re

    block = code_block("yaml", "scheduling-preset: latency")
    block = re.sub(r"(?m)^model: .*$", f"model: {STORIES}", block)
    cfg = tmp_path / "readme.yaml"
    cfg.write_text(block + "threads: 1\n")
    s = Server(["--config", str(cfg)]).start()
    try:
        text = requests.get(s.url("/metrics"), timeout=10).text
    finally:
        s.stop()
    assert "vllm:num_requests_running" in text and "pagellm:num_requests_running" in text
