"""EleutherAI's lm-evaluation-harness (from PyPI, pinned in
tools/requirements-lm-eval.txt, installed by `make setup` into .venv-lm-eval)
runs a log-likelihood task against `pagellm serve` with its local-completions
model (echo + logprobs requests, the server's /tokenize as its tokenizer). The
task and its data ship in tests/e2e/data/lm_eval; no network is used. Each
item's log-likelihood and is_greedy equal what the server's prompt_logprobs
give for the same tokens (which test_prompt_logprobs.py checks against
transformers and `pagellm perplexity`)."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import requests

from conftest import REPO

LM_EVAL = Path(os.environ.get("PAGELLM_LM_EVAL", REPO / ".venv-lm-eval" / "bin" / "lm_eval"))
TASK_DIR = REPO / "tests" / "e2e" / "data" / "lm_eval"
TASK = "pagellm_tiny_stories"


def tokenize(server, text):
    r = requests.post(server.url("/tokenize"), json={"prompt": text, "add_special_tokens": False}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def server_loglikelihood(server, context, continuation):
    """Sum of the continuation tokens' prompt logprobs, and whether each was the most likely."""
    ctx, whole = tokenize(server, context), tokenize(server, context + continuation)
    assert whole[:len(ctx)] == ctx, "the context's tokens must be a prefix of the whole's"
    r = requests.post(server.url("/v1/completions"),
                      json={"prompt": whole, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}, timeout=60)
    assert r.status_code == 200, r.text
    lps = r.json()["choices"][0]["prompt_logprobs"]
    scored = [lps[p][str(whole[p])] for p in range(len(ctx), len(whole))]
    return sum(s["logprob"] for s in scored), all(s["rank"] == 1 for s in scored)


def test_loglikelihood_task_matches_the_servers_prompt_logprobs(stories_server, tmp_path):
    if not LM_EVAL.exists():
        pytest.skip(f"lm-evaluation-harness is not installed ({LM_EVAL}; `make setup` installs "
                    "tools/requirements-lm-eval.txt into .venv-lm-eval)")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               TOKENIZERS_PARALLELISM="false")
    args = [str(LM_EVAL), "run", "--model", "local-completions", "--model_args",
            f"model=stories260K,base_url={stories_server.url('/v1/completions')},tokenizer_backend=remote,"
            "num_concurrent=4,max_retries=1",
            "--tasks", TASK, "--include_path", str(TASK_DIR), "--output_path", str(tmp_path / "out"),
            "--log_samples"]
    # The task's data file is named relative to the working directory.
    run = subprocess.run(args, cwd=TASK_DIR, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    samples = [json.loads(line) for f in sorted((tmp_path / "out").rglob(f"samples_{TASK}_*.jsonl"))
               for line in f.read_text().splitlines()]
    docs = [json.loads(line) for line in (TASK_DIR / "tiny_stories_choice.jsonl").read_text().splitlines()]
    assert len(samples) == len(docs)
    correct = 0
    for s in samples:
        doc = s["doc"]
        got = [(float(ll), greedy == "True") for [[ll, greedy]] in s["resps"]]
        assert len(got) == len(doc["choices"])
        for (ll, greedy), choice in zip(got, doc["choices"]):
            want, want_greedy = server_loglikelihood(stories_server, doc["context"], " " + choice)
            assert ll == pytest.approx(want, abs=1e-3), (doc, choice)
            assert greedy == want_greedy, (doc, choice)
        correct += max(range(len(got)), key=lambda j: got[j][0]) == doc["label"]

    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert results["results"][TASK]["acc,none"] == pytest.approx(correct / len(docs))
