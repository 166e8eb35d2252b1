"""Fixtures of the Python package's tests (pagellm installed into .venv by
`make python-test`). Models: stories260K from ../shared/data (skipped when
missing) and the default model (Gemma 3 270M) where a test names it."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("PAGELLM_BIN", REPO / "build" / "pagellm"))
SHARED = Path(os.environ.get("PAGELLM_SHARED_DATA", REPO.parent / "shared" / "data"))
STORIES = SHARED / "models" / "stories260K.gguf"

# One thread per engine: tests run next to each other on small machines.
ENGINE_ARGS = {"num_threads": 1, "max_model_len": 256}


def default_model_path():
    txt = REPO / "build" / "default-model.txt"
    if txt.exists():
        p = Path(txt.read_text().strip())
        if p.exists():
            return p
    return None


@pytest.fixture(scope="session")
def stories_path():
    if not STORIES.exists():
        pytest.skip(f"missing test data: {STORIES}")
    return str(STORIES)


@pytest.fixture(scope="session")
def gemma_path():
    p = default_model_path()
    if p is None:
        pytest.skip("the default model is not installed (make setup)")
    return str(p)


@pytest.fixture(scope="session")
def llm(stories_path):
    from pagellm import LLM
    return LLM(model=stories_path, seed=0, **ENGINE_ARGS)


def cli_greedy(model, prompts, max_tokens):
    """Token ids of `pagellm generate --batch` at temperature 0, per prompt."""
    import json
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN}")
    lines = "".join(json.dumps({"prompt": p, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}) + "\n"
                    for p in prompts)
    out = subprocess.run([str(BIN), "generate", "-m", str(model), "--batch", "-", "-t", "1"], input=lines,
                         capture_output=True, text=True, timeout=300, check=True)
    return [json.loads(line)["token_ids"] for line in out.stdout.splitlines()]
