"""Speculative decoding through `pagellm serve`, `generate` and `bench`: the
same greedy text as without it, vLLM's spec_decode metrics, and clear errors
for a bad --speculative-config or a draft with another vocabulary."""
import json
import re
import subprocess

import pytest
import requests

from conftest import STORIES, Server, openai_client, model_name

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2})
PROMPTS = [
    "Once upon a time, there was a little girl named Lily. Once upon a time, there was a little",
    "Tom had a red ball. Tom had a red ball. Tom had a",
    "The sun was hot. The dog was happy.",
]


@pytest.fixture(scope="module")
def servers():
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    plain = Server([]).start()
    spec = Server(["--speculative-config", NGRAM]).start()
    yield plain, spec
    assert plain.stop() == 0, plain.output()
    assert spec.stop() == 0, spec.output()


def completion(server, prompt, **kw):
    client = openai_client(server)
    args = dict(model=model_name(server), prompt=prompt, max_tokens=60, temperature=0)
    args.update(kw)
    return client.completions.create(**args)


def metric(text, name):
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+]+)", text, re.M)
    return float(m.group(1)) if m else None


def test_same_text_as_without_speculation(servers):
    plain, spec = servers
    for prompt in PROMPTS:
        a = completion(plain, prompt)
        b = completion(spec, prompt)
        assert b.choices[0].text == a.choices[0].text, prompt
        assert b.choices[0].finish_reason == a.choices[0].finish_reason
        assert b.usage.completion_tokens == a.usage.completion_tokens
    # Streaming, seeded sampling with logprobs and a stop string: the same too.
    kw = dict(temperature=0.8, seed=7, logprobs=2, stop=["Lily"])
    a = completion(plain, PROMPTS[0], **kw)
    b = completion(spec, PROMPTS[0], **kw)
    assert b.choices[0].text == a.choices[0].text
    assert b.choices[0].logprobs.token_logprobs == a.choices[0].logprobs.token_logprobs
    client = openai_client(spec)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_name(spec), prompt=PROMPTS[1], max_tokens=60, temperature=0, stream=True))
    assert streamed == completion(plain, PROMPTS[1]).choices[0].text


def test_spec_decode_metrics(servers):
    _, spec = servers
    completion(spec, PROMPTS[1])
    text = requests.get(spec.url("/metrics"), timeout=10).text
    drafts = metric(text, "pagellm:spec_decode_num_drafts_total")
    tokens = metric(text, "pagellm:spec_decode_num_draft_tokens_total")
    accepted = metric(text, "pagellm:spec_decode_num_accepted_tokens_total")
    assert drafts and drafts > 0, text
    assert tokens >= drafts and 0 < accepted <= tokens
    per_pos = re.findall(r'^pagellm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d)"\} ([0-9.]+)',
                         text, re.M)
    assert [p for p, _ in per_pos] == ["0", "1", "2", "3"]
    assert sum(float(v) for _, v in per_pos) == accepted
    assert float(per_pos[0][1]) >= float(per_pos[3][1])  # a later position is accepted only after the earlier ones


def run(pagellm_bin, *args, timeout=120):
    return subprocess.run([pagellm_bin, *args], capture_output=True, text=True, timeout=timeout)


def test_generate_and_bench_take_the_flag(pagellm_bin, stories_model, tmp_path):
    base = run(pagellm_bin, "generate", "-m", stories_model, "-p", PROMPTS[1], "-n", "40", "--temp", "0")
    fast = run(pagellm_bin, "generate", "-m", stories_model, "-p", PROMPTS[1], "-n", "40", "--temp", "0",
               "--speculative-config", NGRAM)
    assert base.returncode == 0 and fast.returncode == 0, fast.stderr
    assert fast.stdout == base.stdout
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "max_tokens": 40}) + "\n" for p in PROMPTS))
    out = run(pagellm_bin, "bench", "throughput", "-m", stories_model, "--dataset", str(data),
              "--speculative-config", NGRAM, "--num-iters", "1")
    assert out.returncode == 0, out.stderr
    assert "acceptance" in out.stderr and "mean accepted length" in out.stderr, out.stderr
    record = json.loads(out.stdout)
    spec = record["results"]["speculative"]
    assert spec["num_drafts"] > 0 and 0 < spec["acceptance_rate"] <= 1 and spec["mean_accepted_length"] > 1


@pytest.mark.parametrize("config,words", [
    ("{not json", "not valid JSON"),
    ('{"method": "ngram"}', "num_speculative_tokens"),
    ('{"method": "medusa", "num_speculative_tokens": 2}', 'unknown method "medusa"'),
    ('{"method": "ngram", "num_speculative_tokens": 2, "k": 1}', 'unknown key "k"'),
])
def test_bad_config_is_a_clear_startup_error(pagellm_bin, stories_model, config, words):
    p = run(pagellm_bin, "serve", stories_model, "--port", "0", "--speculative-config", config)
    assert p.returncode != 0 and p.returncode < 128
    assert words in p.stderr, p.stderr


def test_draft_with_another_vocabulary_is_refused(pagellm_bin, stories_model, tmp_path):
    draft = tmp_path / "draft.gguf"
    made = run(pagellm_bin, "make-dummy", "--shape", "tiny-llama", "--type", "f32", "-o", str(draft))
    assert made.returncode == 0, made.stderr
    p = run(pagellm_bin, "serve", stories_model, "--port", "0",
            "--speculative-config", json.dumps({"model": str(draft), "num_speculative_tokens": 3}))
    assert p.returncode != 0 and p.returncode < 128
    assert "does not share the target model's vocabulary" in p.stderr, p.stderr


def test_draft_model_serves_the_same_text(pagellm_bin, stories_model):
    """stories260K as its own draft: every draft is accepted, the text is unchanged."""
    spec = Server(["--speculative-config", json.dumps({"model": stories_model, "num_speculative_tokens": 3})]).start()
    plain = Server([]).start()
    try:
        for prompt in PROMPTS[:2]:
            assert completion(spec, prompt).choices[0].text == completion(plain, prompt).choices[0].text
        text = requests.get(spec.url("/metrics"), timeout=10).text
        assert metric(text, "pagellm:spec_decode_num_accepted_tokens_total") == \
            metric(text, "pagellm:spec_decode_num_draft_tokens_total") > 0
    finally:
        assert spec.stop() == 0, spec.output()
        assert plain.stop() == 0, plain.output()
