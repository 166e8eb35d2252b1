"""Tensor and pipeline parallelism under mpirun (2 ranks on this machine, one
thread each): with --exact-matmul the greedy tokens of TP=2, PP=2 (and both) equal
those of one rank, token for token; on quantized matrix products they agree up
to a near-tie (vLLM's check_logprobs_close rule: where they part, each one's
token is in the other's top 5). Also: the launch errors, and a rank that dies
under a running server (rank 0 fails the open request with a clear error and
the job exits non-zero instead of hanging)."""

import json
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

import prom
from conftest import BIN, REPO, STORIES, Server, default_model_path, free_port
from test_devices import needs_opencl

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed (make setup installs OpenMPI)")

TEXT_PROMPTS = ["Once upon a time", "The little dog ran to the park and", "Lily", "Tom and his mom went to the",
                "One day, a big red ball"]
# About 80-120 tokens each: a step of these prompts is cut into several
# pipeline micro-batches (each holds at least 64 tokens), some of them inside
# a prompt.
LONG_PROMPTS = [(p + ". ") * k for p, k in zip(TEXT_PROMPTS, (16, 9, 40, 12, 11))]
ID_PROMPTS = [[1, 5, 9, 200, 31], [3, 3, 70], [400, 12, 8, 9, 10, 11, 12, 13, 14, 15, 16], [7], [250, 251, 252, 253]]
# Longer than the tiny shapes' 32-token windows, and together cut into micro-batches.
LONG_ID_PROMPTS = [[(7 * i + k) % 500 + 1 for i in range(n)] for k, n in ((3, 40), (11, 75), (5, 100), (2, 9))]


def mpi(n, args):
    return [MPIRUN, "-np", str(n), "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", str(BIN), *args]


def batch_file(tmp_path, prompts, max_tokens=16):
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "max_tokens": max_tokens, "temperature": 0, "logprobs": 5}) + "\n"
                            for p in prompts))
    return path


def generate(model_args, batch, ranks=1, parallel=(), extra=()):
    threads = [] if "opencl" in model_args else ["--threads", "1"]
    args = ["generate", *model_args, "--batch", str(batch), *threads, "--max-model-len", "256", *parallel, *extra]
    cmd = mpi(ranks, args) if ranks > 1 else [str(BIN), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == sum(1 for _ in open(batch)), out.stdout
    for line in lines:
        assert "error" not in line, line
    return lines


def assert_same(ref, got):
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in ref]


def assert_close(ref, got):
    for a, b in zip(ref, got):
        for i, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])):
            if x == y:
                continue
            top_a = {t for t, _ in a["logprobs"][i]["top"]}
            top_b = {t for t, _ in b["logprobs"][i]["top"]}
            assert y in top_a and x in top_b, f"request {a['index']} parts at token {i}: {x} vs {y}, not a near-tie"
            break


def need(path):
    if path is None or not path.exists():
        pytest.skip(f"missing model {path}")
    return path


PARALLEL = {"tp2": (2, ["--tensor-parallel-size", "2"]), "pp2": (2, ["--pipeline-parallel-size", "2"]),
            "pp2-4+1": (2, ["--pipeline-parallel-size", "2", "--pipeline-layer-partition", "4,1"]),
            "pp2-balanced": (2, ["--pipeline-parallel-size", "2", "--pipeline-layer-partition", "balanced"]),
            # tiny-gemma4's last three layers read layers 1 and 2's K/V: a cut that keeps them together
            "pp2-1+5": (2, ["--pipeline-parallel-size", "2", "--pipeline-layer-partition", "1,5"])}


@pytest.mark.parametrize("how", ["tp2", "pp2", "pp2-4+1"])
def test_stories_exact_equals_one_rank(tmp_path, how):
    model = ["--model", str(need(STORIES)), "--exact-matmul"]
    batch = batch_file(tmp_path, TEXT_PROMPTS + LONG_PROMPTS, max_tokens=24)
    ref = generate(model, batch)
    ranks, flags = PARALLEL[how]
    assert_same(ref, generate(model, batch, ranks, flags))


def test_stories_one_long_prompt_cut_into_micro_batches(tmp_path):
    """About 210 prompt tokens: 3 micro-batches, each a chunk of the same prompt."""
    model = ["--model", str(need(STORIES)), "--exact-matmul"]
    batch = batch_file(tmp_path, [(TEXT_PROMPTS[1] + ". ") * 16], max_tokens=24)
    ref = generate(model, batch)
    assert ref[0]["prompt_tokens"] > 192
    assert_same(ref, generate(model, batch, 2, ["--pipeline-parallel-size", "2"]))


def test_stories_four_ranks_and_single_micro_batches(tmp_path):
    """TP=4; TP=2 inside each of 2 pipeline stages (4 ranks); one micro-batch per step."""
    model = ["--model", str(need(STORIES)), "--exact-matmul"]
    batch = batch_file(tmp_path, TEXT_PROMPTS + LONG_PROMPTS)
    ref = generate(model, batch)
    assert_same(ref, generate(model, batch, 4, ["--tensor-parallel-size", "4"]))
    assert_same(ref, generate(model, batch, 4, ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"]))
    assert_same(ref, generate(model, batch, 2, ["--pipeline-parallel-size", "2", "--pipeline-micro-batches", "1"]))


@pytest.mark.parametrize("how", ["tp2", "pp2", "pp2-balanced"])
def test_default_model_exact_equals_one_rank(tmp_path, how):
    """Gemma 3 270M Q4_K_M: one KV head, so under TP=2 each rank keeps a copy of it."""
    model = ["--model", str(need(default_model_path())), "--exact-matmul"]
    batch = batch_file(tmp_path, TEXT_PROMPTS + LONG_PROMPTS[:2])
    ref = generate(model, batch)
    ranks, flags = PARALLEL[how]
    assert_same(ref, generate(model, batch, ranks, flags))


def test_default_model_quantized_within_near_ties(tmp_path):
    model = ["--model", str(need(default_model_path()))]
    batch = batch_file(tmp_path, TEXT_PROMPTS)
    ref = generate(model, batch)
    assert_close(ref, generate(model, batch, 2, ["--tensor-parallel-size", "2"]))


@pytest.mark.parametrize("shape,how", [("tiny-qwen3moe", "tp2"), ("tiny-qwen2moe", "tp2"), ("tiny-gptoss", "tp2"),
                                       ("tiny-gemma3", "tp2"), ("tiny-phi3", "tp2"), ("tiny-mixtral", "pp2")])
def test_families_exact_within_near_ties(tmp_path, shape, how):
    """Random weights of real families (MoE experts cut by their hidden units,
    a shared expert, biases, sinks, fused QKV): float sums in another order
    part only at near-ties."""
    model = ["--load-format", "dummy", "--dummy-shape", shape, "--exact-matmul"]
    batch = batch_file(tmp_path, ID_PROMPTS)
    ref = generate(model, batch)
    ranks, flags = PARALLEL[how]
    assert_close(ref, generate(model, batch, ranks, flags))


@pytest.mark.parametrize("shape,how", [("tiny-qwen35", "pp2"), ("tiny-qwen3next", "pp2"), ("tiny-qwen35", "tp2"),
                                       ("tiny-qwen3next", "tp2"), ("tiny-qwen35moe", "tp2")])
def test_linear_attention_parallel_equals_one_rank(tmp_path, shape, how):
    """Gated DeltaNet layers' states on their own stage (each virtual engine
    its own range of state slots), or cut by key heads and the value heads
    that read them (tiled as in GGUF files, grouped as in Qwen3-Next's; the
    gated attention layers by query heads), with n-gram speculation's
    snapshots on top: the same greedy tokens as one rank."""
    model = ["--load-format", "dummy", "--dummy-shape", shape, "--exact-matmul"]
    batch = batch_file(tmp_path, ID_PROMPTS, max_tokens=24)
    ref = generate(model, batch)
    ranks, flags = PARALLEL[how]
    assert_same(ref, generate(model, batch, ranks, flags))
    spec = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4,
                                                "prompt_lookup_min": 1, "prompt_lookup_max": 3})]
    assert_same(ref, generate(model, batch, ranks, flags, spec))


@pytest.mark.parametrize("shape,how", [("tiny-gemma4", "tp2"), ("tiny-gemma4g", "tp2"), ("tiny-gemma4-31b", "tp2"),
                                       ("tiny-gemma4-31b", "pp2"), ("tiny-gemma4moe", "tp2"), ("tiny-gemma4", "pp2-1+5"),
                                       ("tiny-gemma4g", "pp2-1+5")])
def test_gemma4_parallel_equals_one_rank(tmp_path, shape, how):
    """Gemma 4: per-layer embeddings looked up in each rank's vocabulary
    slice (and, across pipeline stages, computed on the first and sent on
    with the hidden states), layers that read an earlier layer's K/V, global
    layers of their own head size and KV heads (cut per layer; one KV head
    replicated), values taken from the keys, the double-wide MLP, the MoE
    variant: the same greedy tokens as one rank."""
    model = ["--load-format", "dummy", "--dummy-shape", shape, "--exact-matmul"]
    batch = batch_file(tmp_path, ID_PROMPTS + LONG_ID_PROMPTS, max_tokens=24)
    ref = generate(model, batch)
    ranks, flags = PARALLEL[how]
    assert_same(ref, generate(model, batch, ranks, flags))


@pytest.mark.parametrize("shape", ["tiny-gemma3", "tiny-gemma2"])
def test_sliding_window_groups_across_pipeline_stages(tmp_path, shape):
    """Sliding-window layers in KV-cache groups of their own, under pipeline
    parallelism: each stage holds some of the groups, every micro-batch
    carries every group's slots, and prompts run past the window: the same
    greedy tokens as one rank."""
    model = ["--load-format", "dummy", "--dummy-shape", shape, "--exact-matmul"]
    batch = batch_file(tmp_path, LONG_ID_PROMPTS, max_tokens=24)
    ref = generate(model, batch)
    assert_same(ref, generate(model, batch, 2, ["--pipeline-parallel-size", "2"]))


@pytest.mark.parametrize("shape,ranks", [("tiny-deepseek3", 2), ("tiny-deepseek3", 4), ("tiny-deepseek2", 2)])
def test_mla_exact_equals_one_rank(tmp_path, shape, ranks):
    """Multi-head latent attention cut by query heads (q_b rows, the absorbed
    per-head matrices, o_proj columns; the latent cache whole on every rank),
    with q-LoRA (V3) and without (V2), and the DeepSeek MoE FFN: the same
    greedy tokens as one rank, one query head per rank at TP=4, and with
    n-gram speculation on top."""
    model = ["--load-format", "dummy", "--dummy-shape", shape, "--exact-matmul"]
    batch = batch_file(tmp_path, ID_PROMPTS, max_tokens=24)
    ref = generate(model, batch)
    tp = ["--tensor-parallel-size", str(ranks)]
    assert_same(ref, generate(model, batch, ranks, tp))
    spec = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4,
                                                "prompt_lookup_min": 1, "prompt_lookup_max": 3})]
    assert_same(ref, generate(model, batch, ranks, tp, spec))


@pytest.mark.parametrize("shape,dtype,how", [("tiny-llama", "f32", "tp2"), ("tiny-qwen3moe", "bf16", "tp2"),
                                             ("tiny-gemma3", "bf16", "tp2"), ("tiny-qwen3", "f16", "pp2"),
                                             ("tiny-qwen35", "f32", "tp2"), ("tiny-gemma4g", "bf16", "tp2")])
def test_safetensors_folder_shards_equal_one_rank(tmp_path, shape, dtype, how):
    """Shards cut at load from a Hugging Face folder (config.json and two
    safetensors files) as from a GGUF file: the same greedy tokens as one rank."""
    folder = tmp_path / "hf"
    made = subprocess.run([str(BIN), "make-dummy", "--shape", shape, "--type", dtype, "--format", "hf",
                           "--shards", "2", "-o", str(folder)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    # The tiny shapes have stories260K's 512-token vocabulary.
    model = ["--model", str(folder), "--tokenizer", str(need(STORIES)), "--exact-matmul"]
    batch = batch_file(tmp_path, ID_PROMPTS)
    ref = generate(model, batch)
    ranks, flags = PARALLEL[how]
    assert_same(ref, generate(model, batch, ranks, flags))


def test_pipeline_server_survives_clients_that_leave_mid_step(tmp_path):
    """PP=2 keeps two steps in flight (a virtual engine per stage): clients
    that disconnect while their step is in a later stage are aborted once it
    is back; the others finish, no KV block is left behind, and a greedy
    request afterwards equals one rank's."""
    stories = str(need(STORIES))
    port = free_port()
    server = Server(cmd=mpi(2, ["serve", stories, "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
                                "--exact-matmul", "--pipeline-parallel-size", "2"]), port=port)
    server.start(timeout=180)
    try:
        assert "2 steps in flight" in server.output()
        body = {"max_tokens": 200, "stream": True, "ignore_eos": True, "temperature": 0}
        streams = [requests.post(server.url("/v1/completions"), stream=True, timeout=60,
                                 json={**body, "prompt": p}) for p in TEXT_PROMPTS + LONG_PROMPTS]
        kept = []
        for i, s in enumerate(streams):
            lines = s.iter_lines()
            assert next(line for line in lines if line.startswith(b"data:"))
            if i % 2:
                s.close()  # leaves while the engine has steps in flight
            else:
                kept.append(lines)
        for lines in kept:
            text = b"\n".join(lines)
            assert b'"finish_reason":"length"' in text and text.rstrip().endswith(b"data: [DONE]"), text[-300:]
        for _ in range(100):
            m = prom.parse(requests.get(server.url("/metrics"), timeout=10).text)
            if prom.value(m, "pagellm:num_requests_running") == 0:
                break
            time.sleep(0.1)
        assert prom.value(m, "pagellm:num_requests_running") == 0
        assert prom.value(m, "pagellm:kv_blocks_used") == 0
        got = requests.post(server.url("/v1/completions"), timeout=60,
                            json={"prompt": TEXT_PROMPTS[0], "max_tokens": 16, "temperature": 0}).json()
    finally:
        server.kill()
    ref = generate(["--model", stories, "--exact-matmul"], batch_file(tmp_path, TEXT_PROMPTS[:1]))
    assert got["choices"][0]["text"] == ref[0]["text"]


@pytest.mark.parametrize("how", ["tp2", "pp2"])
def test_draft_model_speculation_under_parallelism(tmp_path, how):
    """The draft model runs on rank 0 beside the sharded target (its own
    backend and KV cache); the target verifies the drafts across the ranks.
    Greedy texts equal one rank's without speculation, and drafts are accepted."""
    stories = str(need(STORIES))
    port = free_port()
    spec = json.dumps({"model": stories, "num_speculative_tokens": 3})
    ranks, flags = PARALLEL[how]
    server = Server(cmd=mpi(ranks, ["serve", stories, "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
                                    "--exact-matmul", "--speculative-config", spec, *flags]), port=port)
    server.start(timeout=180)
    try:
        with ThreadPoolExecutor(len(TEXT_PROMPTS)) as pool:
            got = list(pool.map(lambda p: requests.post(server.url("/v1/completions"), timeout=120, json={
                "prompt": p, "max_tokens": 24, "temperature": 0}).json(), TEXT_PROMPTS))
        m = prom.parse(requests.get(server.url("/metrics"), timeout=10).text)
    finally:
        server.kill()
    ref = generate(["--model", stories, "--exact-matmul"], batch_file(tmp_path, TEXT_PROMPTS, max_tokens=24))
    assert [g["choices"][0]["text"] for g in got] == [r["text"] for r in ref]
    assert prom.value(m, "pagellm:spec_decode_num_accepted_tokens_total") > 0


@pytest.mark.parametrize("how", ["tp2", "pp2"])
def test_perplexity_under_parallelism(how):
    """`perplexity` runs its passes through the ranks as the engine's steps do:
    with --exact-matmul the same perplexity as one rank (TP sums in another
    order, so up to float rounding)."""
    stories = str(need(STORIES))
    text = "/usr/share/common-licenses/GPL-3"
    if not os.path.exists(text):
        pytest.skip(f"missing {text}")

    def ppl(ranks, flags):
        args = ["perplexity", "-m", stories, "-f", text, "--ctx", "128", "--chunks", "6", "--threads", "1",
                "--exact-matmul", *flags]
        out = subprocess.run(mpi(ranks, args) if ranks > 1 else [str(BIN), *args], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return float(out.stdout.split("Final estimate: PPL = ")[1].split()[0])

    ranks, flags = PARALLEL[how]
    assert ppl(ranks, flags) == pytest.approx(ppl(1, []), rel=1e-5)


@pytest.mark.parametrize("how", ["tp2", "pp2"])
def test_prompt_logprobs_under_parallelism(how):
    """Prompt logprobs' rows of logits come back through the ranks (pipeline:
    from the last stage, prompts cut into micro-batches): the same values as
    one rank, up to float rounding (F32 KV cache: TP sums in another order,
    and an F16 cache would round those differences up to 2e-3)."""
    stories = str(need(STORIES))
    bodies = [{"prompt": p, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2} for p in LONG_PROMPTS[:3]]

    def scores(ranks, flags):
        port = free_port()
        cmd = ["serve", stories, "--host", "127.0.0.1", "--port", str(port), "--threads", "1", "--exact-matmul",
               "--max-model-len", "512", "--kv-cache-dtype", "f32", *flags]
        server = Server(cmd=mpi(ranks, cmd) if ranks > 1 else [str(BIN), *cmd], port=port)
        server.start(timeout=180)
        try:
            with ThreadPoolExecutor(len(bodies)) as pool:
                return list(pool.map(lambda b: requests.post(server.url("/v1/completions"), json=b, timeout=120).json()
                                     ["choices"][0]["prompt_logprobs"], bodies))
        finally:
            server.kill()

    ranks, flags = PARALLEL[how]
    for one, many in zip(scores(1, []), scores(ranks, flags)):
        assert len(one) == len(many) > 64 and one[0] is None and many[0] is None
        for a, b in zip(one[1:], many[1:]):
            assert a.keys() == b.keys()
            for k in a:
                assert b[k]["logprob"] == pytest.approx(a[k]["logprob"], abs=1e-4)


@pytest.mark.parametrize("how", ["tp2", "pp2"])
def test_rerank_under_parallelism(how):
    """A score request's pooled row comes back through the ranks like an embedding's: the tiny reranker's
    scores (llama.cpp's converted GGUF of tests/fixtures/hf/rerank-tiny-qwen3.json) equal transformers'."""
    ref = json.loads((REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.json").read_text())
    model = need(REPO / "tests" / "fixtures" / "hf" / "rerank-tiny-qwen3.gguf")
    ranks, flags = PARALLEL[how]
    port = free_port()
    cmd = ["serve", str(model), "--task", "score", "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
           "--exact-matmul", "--max-model-len", "256", "--kv-cache-dtype", "f32", *flags]
    server = Server(cmd=mpi(ranks, cmd), port=port)
    server.start(timeout=180)
    try:
        r = requests.post(server.url("/v1/rerank"), json={"query": ref["query"], "documents": ref["documents"]},
                          timeout=120)
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    finally:
        server.kill()
    for i, want in enumerate(ref["scores"][:len(ref["documents"])]):
        assert got[i] == pytest.approx(want, abs=1e-4)


def test_launch_errors_are_clear(tmp_path):
    stories = str(need(STORIES))
    out = subprocess.run([str(BIN), "generate", "--model", stories, "-p", "Once", "--tensor-parallel-size", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "needs 2 processes; this run has 1" in out.stderr
    out = subprocess.run(mpi(3, ["generate", "--model", stories, "-p", "Once", "--tensor-parallel-size", "3"]),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "does not divide the model's 8 attention heads" in out.stdout + out.stderr
    out = subprocess.run(mpi(2, ["generate", "--model", stories, "-p", "Once", "--pipeline-parallel-size", "2",
                                 "--pipeline-layer-partition", "2,2"]), capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "adds up to 4 layers; the model has 5" in out.stdout + out.stderr
    # tiny-gemma4's even cut leaves layer 3 on the second stage, its K/V source (layer 1) on the first
    out = subprocess.run(mpi(2, ["generate", "--load-format", "dummy", "--dummy-shape", "tiny-gemma4", "-p", "Once",
                                 "--pipeline-parallel-size", "2"]), capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "layer 3 reuses the K/V of layer 1, which another pipeline stage holds" in (
        out.stdout + out.stderr)


def test_dead_rank_fails_requests_and_exits_nonzero():
    model = need(default_model_path())
    port = free_port()
    server = Server(cmd=mpi(2, ["serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
                                "--max-model-len", "512", "--tensor-parallel-size", "2"]), port=port)
    server.start(timeout=180)
    try:
        stream = requests.post(server.url("/v1/completions"), stream=True, timeout=60,
                               json={"prompt": "Once", "max_tokens": 400, "stream": True, "ignore_eos": True})
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith(b"data:"))  # the request is running
        pid = int(server.output().split("(pid ")[1].split(")")[0])
        os.kill(pid, signal.SIGKILL)
        start = time.time()
        rest = b"\n".join(lines)  # ends: the server does not hang the client
        assert b"parallel job is stopping" in rest, rest[-500:]
        assert server.proc.wait(60) != 0
        assert time.time() - start < 60
        assert "the parallel job is stopping" in server.output()
    finally:
        server.kill()


@needs_opencl
@pytest.mark.parametrize("how", ["tp2", "pp2"])
def test_opencl_goes_through_the_host_collectives(tmp_path, how):
    """OpenCL has no communicator of its own: its all-reduces and stage-to-stage
    hidden states take the host default (device -> host -> MPI -> device)."""
    need(STORIES)
    model = ["--model", str(STORIES), "--device", "opencl"]
    batch = batch_file(tmp_path, TEXT_PROMPTS, max_tokens=16)
    ref = generate(model, batch)
    ranks, flags = PARALLEL[how]
    assert_close(ref, generate(model, batch, ranks, flags))


@pytest.mark.parametrize("how", ["tp2", "pp2"])
def test_embeddings_under_parallelism(how):
    """Tensor parallelism: rank 0 pools its own residual stream (whole there). Pipeline: the last stage sends
    the pooled rows' hidden states after the step's logits, prompts cut into micro-batches. The vectors of
    one rank, up to float rounding (the ranks sum their shares in another order)."""
    stories = str(need(STORIES))
    body = {"input": LONG_PROMPTS[:3] + ID_PROMPTS[:2], "encoding_format": "float"}

    def vectors(ranks, flags):
        port = free_port()
        cmd = ["serve", stories, "--host", "127.0.0.1", "--port", str(port), "--threads", "1", "--exact-matmul",
               "--max-model-len", "512", "--kv-cache-dtype", "f32", "--task", "embed", *flags]
        server = Server(cmd=mpi(ranks, cmd) if ranks > 1 else [str(BIN), *cmd], port=port)
        server.start(timeout=180)
        try:
            r = requests.post(server.url("/v1/embeddings"), json=body, timeout=120)
            assert r.status_code == 200, r.text
            return [d["embedding"] for d in r.json()["data"]]
        finally:
            server.kill()

    ranks, flags = PARALLEL[how]
    for one, many in zip(vectors(1, []), vectors(ranks, flags)):
        assert len(one) == len(many)
        assert max(abs(a - b) for a, b in zip(one, many)) < 1e-4
