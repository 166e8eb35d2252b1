"""Prompt logprobs through the server: vLLM's `prompt_logprobs` and OpenAI's
legacy `echo` with `logprobs` on /v1/completions, against transformers' logits
(tests/fixtures/hf/hf-tiny-llama-f32.*, the same weights as `pagellm
make-dummy --seed 1`) and against `pagellm perplexity` on stories260K; chunked
prefill, a prefix-cache hit that must not be used, batches, and bad input."""

import json
import math
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import BIN, REPO, STORIES, Server

FIXTURE = REPO / "tests" / "fixtures" / "hf" / "hf-tiny-llama-f32"
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she saw a big red ball under a tree. She ran to get it, but a dog took it first.")


def complete(server, **body):
    r = requests.post(server.url("/v1/completions"), json={"temperature": 0, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()




def reference():
    """transformers' logits at every position of the fixture's tokens, log-softmaxed."""
    meta = json.loads(FIXTURE.with_suffix(".json").read_text())
    raw = FIXTURE.with_suffix(".bin").read_bytes()
    vocab, tokens = meta["n_vocab"], meta["tokens"]
    floats = struct.unpack(f"<{len(raw) // 4}f", raw)
    rows = []
    for p in range(len(tokens)):
        row = floats[p * vocab:(p + 1) * vocab]
        m = max(row)
        norm = m + math.log(sum(math.exp(x - m) for x in row))
        rows.append([x - norm for x in row])
    return tokens, rows


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    """tiny-llama with transformers' reference weights, F32 weights and KV cache; prefill in chunks of 16."""
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    model = tmp_path_factory.mktemp("tiny") / "tiny-llama-f32.gguf"
    subprocess.run([str(BIN), "make-dummy", "--shape", "tiny-llama", "--type", "f32", "--seed", "1", "-o", str(model),
                    "-t", "2"], check=True, capture_output=True, timeout=120)
    template = model.parent / "template.jinja"
    template.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    s = Server(["--max-num-batched-tokens", "16", "--max-model-len", "256", "--kv-cache-dtype", "f32",
                "--chat-template", str(template)], model=model).start()
    yield s
    assert s.stop() == 0, s.output()


def by_id(position):
    return {int(k): v for k, v in position.items()}


def test_match_transformers_through_chunked_prefill(tiny_server):
    tokens, ref = reference()
    c = complete(tiny_server, prompt=tokens, max_tokens=1, prompt_logprobs=3)["choices"][0]
    lps = c["prompt_logprobs"]
    assert len(lps) == len(tokens) and lps[0] is None
    worst = 0.0
    for p in range(1, len(tokens)):
        position, row = by_id(lps[p]), ref[p - 1]
        actual = position[tokens[p]]
        worst = max(worst, abs(actual["logprob"] - row[tokens[p]]))
        # Ranks and the top 3 as far as 1e-3 tells them apart (near ties may swap).
        v = row[tokens[p]]
        assert sum(x >= v + 1e-3 for x in row) < actual["rank"] <= sum(x >= v - 1e-3 for x in row)
        top = sorted((entry["rank"], i, entry["logprob"]) for i, entry in position.items() if entry["rank"] <= 3)
        assert [r for r, _, _ in top] == [1, 2, 3]
        assert [lp for _, _, lp in top] == pytest.approx(sorted(row, reverse=True)[:3], abs=1e-3)
        for _, i, lp in top:
            assert lp == pytest.approx(row[i], abs=1e-3)
    print(f"prompt logprobs vs transformers: max |gap| {worst:.2e}")
    assert worst <= 1e-4, worst  # F32 weights and KV: measured 2e-6


def test_not_taken_from_the_prefix_cache(tiny_server):
    tokens, _ = reference()
    first = complete(tiny_server, prompt=tokens, max_tokens=1, prompt_logprobs=1)
    plain = complete(tiny_server, prompt=tokens, max_tokens=1)
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the prompt is cached ...
    again = complete(tiny_server, prompt=tokens, max_tokens=1, prompt_logprobs=1)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # ... and not used for logprobs
    assert again["choices"][0]["prompt_logprobs"] == first["choices"][0]["prompt_logprobs"]


def test_the_same_alone_and_in_a_batch(tiny_server):
    tokens, _ = reference()
    alone = complete(tiny_server, prompt=tokens, max_tokens=1, prompt_logprobs=2)["choices"][0]["prompt_logprobs"]
    bodies = [dict(prompt=tokens, max_tokens=1, prompt_logprobs=2)] + [
        dict(prompt=tokens[k:] + tokens[:k], max_tokens=8, ignore_eos=True) for k in (3, 11, 17)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda b: complete(tiny_server, **b), bodies))
    batched = results[0]["choices"][0]["prompt_logprobs"]
    for a, b in zip(alone[1:], batched[1:]):
        assert by_id(a).keys() == by_id(b).keys()
        for k in a:
            assert b[k]["logprob"] == pytest.approx(a[k]["logprob"], abs=1e-5)


def test_echo_with_logprobs_covers_prompt_and_completion(tiny_server):
    tokens, ref = reference()
    vllm = complete(tiny_server, prompt=tokens, max_tokens=1, prompt_logprobs=1)["choices"][0]["prompt_logprobs"]
    for max_tokens in (0, 1, 3):
        r = complete(tiny_server, prompt=tokens, max_tokens=max_tokens, echo=True, logprobs=1, ignore_eos=True)
        lp = r["choices"][0]["logprobs"]
        n = len(tokens) + max_tokens
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        for p in range(1, len(tokens)):
            assert lp["token_logprobs"][p] == by_id(vllm[p])[tokens[p]]["logprob"]
            assert lp["token_logprobs"][p] == pytest.approx(ref[p - 1][tokens[p]], abs=1e-3)
            # top 1 plus the token itself: lm-eval's is_greedy test reads this
            best = max(lp["top_logprobs"][p].values())
            assert best == pytest.approx(max(ref[p - 1]), abs=1e-3)
        assert r["usage"]["completion_tokens"] == max_tokens
        assert r["choices"][0]["finish_reason"] == "length"
        assert lp["text_offset"] == sorted(lp["text_offset"])


def test_sum_is_perplexitys_loss(stories_server, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "ppl.json"
    # One window (stride = ctx = 256 > the text's tokens): every token after the first, with all before it.
    run = subprocess.run([str(BIN), "perplexity", "-m", str(STORIES), "-f", str(text), "--ctx", "256", "--stride",
                          "256", "--output-json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    ppl = json.loads(out.read_text())
    r = complete(stories_server, prompt=TEXT, max_tokens=0, echo=True, logprobs=0)
    lps = r["choices"][0]["logprobs"]["token_logprobs"]
    assert len(lps) == ppl["tokens"] and ppl["scored"] == len(lps) - 1
    mean_nll = -sum(lps[1:]) / (len(lps) - 1)
    assert mean_nll == pytest.approx(math.log(ppl["ppl"]), abs=1e-4)


def test_bad_input(stories_server):
    def error(body):
        r = requests.post(stories_server.url("/v1/completions"), json={"prompt": "Once upon", **body}, timeout=30)
        assert r.status_code == 400, r.text
        return r.json()["error"]["param"]

    assert error({"prompt_logprobs": -1}) == "prompt_logprobs"
    assert error({"prompt_logprobs": 21}) == "prompt_logprobs"
    assert error({"prompt_logprobs": "1"}) == "prompt_logprobs"
    assert error({"max_tokens": 0}) == "max_tokens"  # only with echo
    long = [1] + [403] * 600  # stories260K's context is 512 tokens
    assert error({"prompt": long, "echo": True, "logprobs": 1, "max_tokens": 0}) == "prompt"
    assert error({"prompt": long, "prompt_logprobs": 1}) == "prompt"


def stream(server, **body):
    r = requests.post(server.url("/v1/completions"), json={"temperature": 0, "stream": True, **body}, stream=True,
                      timeout=60)
    assert r.status_code == 200, r.text
    lines = [line.decode() for line in r.iter_lines()]
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def test_streamed_as_collected(tiny_server):
    tokens, _ = reference()
    body = dict(prompt=tokens, max_tokens=3, echo=True, logprobs=1, prompt_logprobs=2, ignore_eos=True)
    whole = complete(tiny_server, **body)["choices"][0]
    chunks = [c["choices"][0] for c in stream(tiny_server, **body)]
    assert chunks[0]["prompt_logprobs"] == whole["prompt_logprobs"]
    assert all("prompt_logprobs" not in c for c in chunks[1:])
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    joined = {k: sum((c["logprobs"][k] for c in chunks), []) for k in keys}
    for k, v in joined.items():
        assert v == whole["logprobs"][k], k
    assert "".join(c["text"] for c in chunks) == whole["text"]
    # max_tokens 0: the prompt alone.
    only = [c["choices"][0] for c in stream(tiny_server, prompt=tokens, max_tokens=0, echo=True, logprobs=1)]
    assert len(only[0]["logprobs"]["tokens"]) == len(tokens)
    assert only[-1]["finish_reason"] == "length"


def test_chat_prompt_logprobs_at_the_top(tiny_server):
    messages = [{"role": "user", "content": "tok12 tok40 tok77 tok5"}]
    r = requests.post(tiny_server.url("/v1/chat/completions"),
                      json={"messages": messages, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 1}, timeout=60)
    assert r.status_code == 200, r.text
    chat = r.json()
    ids = requests.post(tiny_server.url("/tokenize"), json={"messages": messages}, timeout=30).json()["tokens"]
    assert len(chat["prompt_logprobs"]) == len(ids) == chat["usage"]["prompt_tokens"]
    same = complete(tiny_server, prompt=ids, max_tokens=1, prompt_logprobs=1)["choices"][0]["prompt_logprobs"]
    assert chat["prompt_logprobs"] == same
