"""Every example in the README runs somewhere in the tests and prints what the
README says it prints. test_readme.py runs the serving examples against
`make serve`; this file runs the rest (the command-line, structured-output,
tool, LoRA, speculative, MPI and bench examples) with the README's own text,
only placeholders (MODEL.gguf, a port) replaced by files the tests have. An
inventory fails on any README code block that no test claims."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import requests

from conftest import (BIN, REPO, STORIES, Server, code_block, default_model_path, free_port, readme_blocks,
                      run_with_port)

LORA = REPO / "tests" / "fixtures" / "lora" / "tiny-llama"

# Each README code block and where it runs: a text only it holds -> the test.
CLAIMS = {
    "make serve   # build": "test_readme.py (readme_server runs `make serve`)",
    "build/pagellm generate -p": "test_using_it_commands",
    "curl http://127.0.0.1:8000/v1/chat/completions": "test_readme.py::test_readme_curl_example",
    "print(reply.choices[0].message.content)  # Paris": "test_readme.py::test_readme_openai_example",
    "class City(BaseModel)": "test_structured_outputs_example",
    "weather = {\"type\": \"function\"": "test_tool_call_example",
    "client.responses.create(": "test_readme.py::test_readme_responses_and_messages_examples",
    "Anthropic(base_url=": "test_readme.py::test_readme_responses_and_messages_examples",
    "serve Qwen3-Embedding-0.6B-Q8_0.gguf --task embed": "test_readme.py::test_readme_embeddings_example",
    "client.embeddings.create(": "test_readme.py::test_readme_embeddings_example",
    "curl -s http://127.0.0.1:8000/v1/rerank": "test_readme.py::test_readme_rerank_example",
    "--enable-lora --max-loras 4": "test_lora_example",
    "# n-gram prompt lookup": "test_speculative_examples",
    "scheduling-preset: latency": "test_config.py (the README's YAML block)",
    "lm_eval run --model local-completions": "test_lm_eval.py (the same command on a shipped task)",
    "mpirun -np 2 build/pagellm serve": "test_mpi_examples",
    "from pagellm import LLM, SamplingParams": "tests/python/test_readme_python.py",
    "pagellm_engine_create(\"model.gguf\"": "tests/python/test_c_api.py (compiles examples/c/generate.c)",
    "build/pagellm bench latency --load-format dummy": "test_bench_examples",
}


def test_every_readme_example_is_run_by_a_test():
    unclaimed = [f"README.md:{line} ({lang}): {body.splitlines()[0]}" for lang, body, line in readme_blocks()
                 if not any(marker in body for marker in CLAIMS)]
    assert not unclaimed, "README examples no test runs (add one and a CLAIMS entry):\n" + "\n".join(unclaimed)
    # The ones run elsewhere: those tests hold the same text.
    c_example = (REPO / "examples" / "c" / "generate.c").read_text()
    for call in re.findall(r"(pagellm_\w+)\(", code_block("c", "pagellm_engine_create(\"model.gguf\"")):
        assert call in c_example, call
    lm_eval = (REPO / "tests" / "e2e" / "test_lm_eval.py").read_text()
    for word in shlex.split(code_block("bash", "lm_eval run --model local-completions").replace("\\\n", " "))[1:5]:
        assert f'"{word}"' in lm_eval, word
    assert "tokenizer_backend=remote" in lm_eval


def run_lines(code, subs, timeout=600, env=None, line_subs=None):
    """Runs a shell block line by line (continuations joined) after the
    substitutions (line_subs: {text in the line: {old: new}} first); returns
    each command's stdout."""
    outputs = []
    for line in code.replace("\\\n", " ").splitlines():
        for marker, these in (line_subs or {}).items():
            if marker in line:
                for old, new in these.items():
                    line = line.replace(old, new)
        for old, new in subs.items():
            line = line.replace(old, new)
        command = line.split("  #")[0].strip()
        if not command or command.startswith("#"):
            continue
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                             env=dict(os.environ, **(env or {})))
        assert out.returncode == 0, f"{command}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
        outputs.append(out.stdout)
    return outputs


@pytest.fixture(scope="module")
def gemma():
    model = default_model_path()
    if model is None:
        pytest.skip("the default model is installed by tools/setup.sh")
    return model


def test_using_it_commands(gemma, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("Once upon a time, there was a little girl named Lily. She liked to play outside. " * 20)
    outputs = run_lines(code_block("sh", "build/pagellm generate -p"), {
        "build/pagellm": str(BIN), "MODEL.gguf": str(STORIES), "TEXT": str(text), "/tmp/tl.gguf": str(tmp_path / "tl.gguf"),
        "../shared/data/models/stories260K.gguf": str(STORIES)})
    generate, story, tokens, info, _, ppl = outputs
    assert "capital" in generate  # a greedy continuation of the prompt
    assert story.strip()
    assert re.fullmatch(r"\[\d+(, \d+)*\]\s*", tokens), tokens
    assert "general.architecture" in info
    assert (tmp_path / "tl.gguf").stat().st_size > 500 << 20  # a 1.1B model at 4.5 bits
    assert "perplexity" in ppl.lower() or re.search(r"\d+\.\d+", ppl)


@pytest.fixture(scope="module")
def gemma_server(gemma):
    s = Server(["--served-model-name", "gemma-3-270m-q4_k_m", "--max-model-len", "2048"], model=gemma).start()
    yield s
    assert s.stop() == 0, s.output()


def run_python(code, port):
    out = subprocess.run([sys.executable, "-c", run_with_port(code, port)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_structured_outputs_example(gemma_server):
    lines = run_python(code_block("python", "class City(BaseModel)"), gemma_server.port)
    # The comments say what each print shows.
    assert lines == ["name='Paris' country='France' is_capital=True", "yes"], lines


def test_tool_call_example(gemma_server):
    setup = "from openai import OpenAI\nclient = OpenAI(base_url=\"http://127.0.0.1:8000/v1\", api_key=\"EMPTY\")\n"
    lines = run_python(setup + code_block("python", "weather = {\"type\": \"function\""), gemma_server.port)
    assert lines == ['get_weather {"city":"Paris"}'] or (
        lines[0].startswith("get_weather ") and json.loads(lines[0].split(" ", 1)[1]) == {"city": "Paris"}), lines


def serve_block_line(line, port, subs):
    for old, new in subs.items():
        line = line.replace(old, new)
    return [*shlex.split(line), "--host", "127.0.0.1", "--port", str(port)]


def test_lora_example(tmp_path):
    """The LoRA example with the tiny Llama of the LoRA fixtures as the base and three of its adapters
    (two PEFT folders, one GGUF file) in the example's places."""
    base = tmp_path / "tiny-llama.gguf"
    subprocess.run([str(BIN), "make-dummy", "--shape", "tiny-llama", "--seed", "1", "--type", "f32", "-o", str(base)],
                   check=True, capture_output=True)
    subs = {"build/pagellm": str(BIN), "tinyllama-1.1b-q4_k_m.gguf": str(base),
            "adapters/sql-lora": str(LORA / "a"), "adapters/support-lora.gguf": str(LORA / "b.gguf"),
            "adapters/legal-lora": str(LORA / "c")}
    code = code_block("sh", "--enable-lora --max-loras 4").replace("\\\n", " ")
    serve_line, *rest = [line for line in code.splitlines() if line.strip()]
    port = free_port()
    s = Server(cmd=serve_block_line(serve_line, port, subs), port=port).start()
    try:
        outputs = run_lines(run_with_port("\n".join(rest), port), subs)
        completion, loaded = outputs
        assert json.loads(completion)["model"] == "sql"
        assert loaded.strip() == "Success: LoRA adapter 'legal' added successfully."
        assert "# " + loaded.strip() in code  # what the README says it prints
        models = requests.get(s.url("/v1/models")).json()["data"]
        assert {m["id"] for m in models} == {"base", "sql", "support", "legal"}
    finally:
        assert s.stop() == 0, s.output()


def test_speculative_examples(gemma):
    """Both lines: n-gram lookup on the default model, and a draft model (stories260K drafting for
    itself, in the places of target.gguf and draft.gguf)."""
    code = code_block("sh", "# n-gram prompt lookup").replace("\\\n", " ")
    lines = [line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) == 2
    for line in lines:
        port = free_port()
        cmd = serve_block_line(line, port, {"build/pagellm": str(BIN), "target.gguf": str(STORIES),
                                            "draft.gguf": str(STORIES)})
        s = Server(cmd=cmd, port=port).start()
        try:
            r = requests.post(s.url("/v1/completions"), json={"prompt": "Once upon a time", "max_tokens": 16,
                                                              "temperature": 0}, timeout=120)
            assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
            assert "spec_decode_num_draft_tokens_total" in requests.get(s.url("/metrics")).text
        finally:
            assert s.stop() == 0, s.output()


def test_mpi_examples(tmp_path):
    """Tensor parallel serve and pipeline parallel generate, on stories260K, with the flags the README
    says to add as root or with more ranks than cores."""
    if not shutil.which("mpirun"):
        pytest.skip("OpenMPI is installed by tools/setup.sh")
    extra = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    code = code_block("bash", "mpirun -np 2 build/pagellm serve")
    serve_line, generate_line = [line for line in code.splitlines() if line.startswith("mpirun")]
    subs = {"build/pagellm": str(BIN), "MODEL.gguf": str(STORIES)}
    port = free_port()
    cmd = serve_block_line(serve_line, port, subs)
    s = Server(cmd=[cmd[0], *extra, *cmd[1:]], port=port).start()
    try:
        r = requests.post(s.url("/v1/completions"), json={"prompt": "Once upon a time", "max_tokens": 8}, timeout=120)
        assert r.status_code == 200, r.text
    finally:
        s.stop(group=True)
    cmd = shlex.split(generate_line.replace("build/pagellm", str(BIN)).replace("MODEL.gguf", str(STORIES)))
    out = subprocess.run([cmd[0], *extra, *cmd[1:]], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip()  # the continuation


def test_bench_examples(gemma):
    """Each bench line runs: MODEL.gguf is stories260K, or the default model for the dataset (its prompts
    need more context than stories260K has), and `bench serve` gets a server of its own."""
    port = free_port()
    s = Server(["--max-model-len", "512"], model=STORIES, port=port).start()
    try:
        outputs = run_lines(code_block("sh", "build/pagellm bench latency --load-format dummy"), {
            "build/pagellm": str(BIN), "MODEL.gguf": str(STORIES), "127.0.0.1:8000": f"127.0.0.1:{port}"},
            line_subs={"--dataset": {"MODEL.gguf": str(gemma)}})
    finally:
        assert s.stop() == 0, s.output()
    assert len(outputs) == 7
    for out in outputs:
        if out.startswith("# pagellm bench ops"):
            assert "GOP/s" in out  # its table
        else:
            json.loads(out)  # the JSON record
