"""The README's run command serves Gemma 3 270M, and its curl and openai
examples work as written (only the port is changed to a free one)."""

import json
import subprocess
import sys
import time

import pytest

from conftest import BIN, README, REPO, Server, code_block, default_model_path, run_with_port

@pytest.fixture(scope="module")
def readme_server():
    model = default_model_path()
    if model is None:
        pytest.skip("the default model is not installed (make setup)")
    assert "make serve" in README.read_text()
    s = Server(cmd=[])  # picks a free port
    group = BIN.resolve() == (REPO / "build" / "pagellm").resolve()
    if group:
        # Exactly the README's command (the build is up to date, so make only checks it).
        s.cmd = ["make", "--no-print-directory", "serve", f"PORT={s.port}"]
    else:
        # Another build: the command `make serve` runs (see the Makefile), with this binary.
        s.cmd = [str(BIN), "serve", "--model", str(model), "--host", "127.0.0.1", "--port", str(s.port)]
    s.start(timeout=600)
    yield s
    s.stop(group=group)
    # With make, make exits at once; the server it started finishes its shutdown.
    deadline = time.time() + 60
    while "shutdown complete" not in s.output():
        assert time.time() < deadline, s.output()
        time.sleep(0.1)


def test_readme_curl_example(readme_server):
    cmd = run_with_port(code_block("sh", "curl http://127.0.0.1:8000/v1/chat/completions"), readme_server.port)
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    content = reply["choices"][0]["message"]["content"]
    assert "paris" in content.lower(), content


def test_readme_openai_example(readme_server):
    code = run_with_port(code_block("python", "OpenAI(base_url="), readme_server.port)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "paris" in out.stdout.lower(), out.stdout


@pytest.mark.parametrize("must_contain", ["client.responses.create(", "Anthropic(base_url="])
def test_readme_responses_and_messages_examples(readme_server, must_contain):
    code = run_with_port(code_block("python", must_contain), readme_server.port)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "paris" in out.stdout.lower(), out.stdout


def test_readme_embeddings_example():
    """The embeddings example, run against the default model served with --task embed under the
    example's model name (Gemma 3 270M is no embedding model: only the shapes are checked)."""
    model = default_model_path()
    if model is None:
        pytest.skip("the default model is not installed (make setup)")
    assert "serve Qwen3-Embedding-0.6B-Q8_0.gguf --task embed" in README.read_text()
    s = Server(["--task", "embed", "--served-model-name", "Qwen3-Embedding-0.6B-Q8_0", "--max-model-len", "512",
                "--kv-cache-memory", "64MiB"], model=model).start()
    try:
        code = run_with_port(code_block("python", "client.embeddings.create("), s.port)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[0] == "2 1.0", out.stdout
    finally:
        assert s.stop() == 0, s.output()


def test_readme_rerank_example():
    """The rerank and score curl examples, against the tiny reranker GGUF of the rerank fixtures served
    under the example's model name (random weights: only the shapes and the order are checked)."""
    text = README.read_text()
    assert "serve qwen3-reranker-0.6b-q8_0.gguf --task score --served-model-name reranker" in text
    block = code_block("sh", "curl -s http://127.0.0.1:8000/v1/rerank")
    model = REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.gguf"
    s = Server(["--task", "score", "--served-model-name", "reranker", "--max-model-len", "512"], model=model).start()
    try:
        cmd = "\n".join(line for line in block.splitlines() if not line.startswith("build/pagellm serve"))
        out = subprocess.run(["bash", "-c", run_with_port(cmd, s.port)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        decoder, replies, at = json.JSONDecoder(), [], 0
        while at < len(out.stdout):
            reply, at = decoder.raw_decode(out.stdout, at)
            replies.append(reply)
        rerank, score = replies
        assert rerank["model"] == "reranker" and len(rerank["results"]) == 2  # top_n
        scores = [r["relevance_score"] for r in rerank["results"]]
        assert scores == sorted(scores, reverse=True)
        assert [d["index"] for d in score["data"]] == [0, 1] and score["object"] == "list"
    finally:
        assert s.stop() == 0, s.output()
