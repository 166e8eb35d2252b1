"""64 concurrent streaming requests with mixed parameters all complete, and
greedy ones give exactly their single-request output (batch invariance)."""

from concurrent.futures import ThreadPoolExecutor

import openai

from conftest import openai_client

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went", "One day, a big bird", "The sun was"]


def params(i):
    p = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 8 + (i * 7) % 40}
    if i % 2 == 0:
        p["temperature"] = 0
    else:
        p.update(temperature=0.9, top_p=0.9, seed=i)
    if i % 5 == 0:
        p["stop"] = ["."]
    return p


def stream(client, p):
    text, finish = "", None
    chunks = client.completions.create(model="stories260K", stream=True, **p)
    for ch in chunks:
        for c in ch.choices:
            text += c.text
            finish = c.finish_reason or finish
    return text, finish


def test_64_concurrent_streams(stories_server):
    client = openai_client(stories_server)
    n = 64
    all_params = [params(i) for i in range(n)]
    # Single-request references for the greedy ones (one at a time).
    reference = {i: client.completions.create(model="stories260K", **p).choices[0].text
                 for i, p in enumerate(all_params) if p.get("temperature") == 0}
    with ThreadPoolExecutor(max_workers=n) as pool:
        clients = [openai.OpenAI(base_url=stories_server.url("/v1"), api_key="x", max_retries=0, timeout=120)
                   for _ in range(n)]
        results = list(pool.map(lambda i: stream(clients[i], all_params[i]), range(n)))
    for i, (text, finish) in enumerate(results):
        assert finish in ("stop", "length"), (i, finish)
        if i in reference:
            assert text == reference[i], (i, all_params[i])
