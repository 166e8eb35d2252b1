"""/v1/completions with the official openai client on stories260K: plain and
streamed, batches of prompts, n > 1, stop strings, logprobs, seeds, echo,
usage numbers (checked with /tokenize), /tokenize and /detokenize."""

import json

import requests

from conftest import model_name, openai_client

PROMPT = "Once upon a time"
# stories260K's greedy continuation (tests/fixtures/models/stories260K-greedy.json).
GREEDY_START = ", there was a little girl named Lily. She loved to play outside in the park."


def complete(server, **kw):
    body = {"model": model_name(server), "prompt": PROMPT, "max_tokens": 16, "temperature": 0, **kw}
    r = requests.post(server.url("/v1/completions"), json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_completion_shape(stories_server):
    client = openai_client(stories_server)
    name = model_name(stories_server)
    c = client.completions.create(model=name, prompt=PROMPT, max_tokens=20, temperature=0)
    assert c.object == "text_completion"
    assert c.id.startswith("cmpl-")
    assert c.model == name
    assert isinstance(c.created, int) and c.created > 1_600_000_000
    assert len(c.choices) == 1
    ch = c.choices[0]
    assert ch.index == 0
    assert GREEDY_START.startswith(ch.text)
    assert ch.finish_reason == "length"
    assert c.usage.completion_tokens == 20
    assert c.usage.prompt_tokens == 5
    assert c.usage.total_tokens == 25


def test_model_field_optional_and_models_list(stories_server):
    r = requests.post(stories_server.url("/v1/completions"), json={"prompt": PROMPT, "max_tokens": 3}, timeout=30)
    assert r.status_code == 200
    models = openai_client(stories_server).models.list()
    assert [m.id for m in models.data] == ["stories260K"]
    m = requests.get(stories_server.url("/v1/models/stories260K"), timeout=10).json()
    assert m["object"] == "model" and m["max_model_len"] == 512


def test_usage_matches_tokenize(stories_server):
    prompt = "The little dog ran to the park and saw a big red ball."
    tok = requests.post(stories_server.url("/tokenize"), json={"prompt": prompt}, timeout=10).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 512
    c = complete(stories_server, prompt=prompt, max_tokens=12, ignore_eos=True, logprobs=0)
    assert c["usage"]["prompt_tokens"] == tok["count"]
    assert c["usage"]["completion_tokens"] == 12 == len(c["choices"][0]["logprobs"]["tokens"])
    assert c["usage"]["total_tokens"] == tok["count"] + 12
    # Token-id prompts count the same and give the same text.
    c2 = complete(stories_server, prompt=tok["tokens"], max_tokens=12, ignore_eos=True)
    assert c2["usage"]["prompt_tokens"] == tok["count"]
    assert c2["choices"][0]["text"] == c["choices"][0]["text"]
    # Detokenize round trip.
    d = requests.post(stories_server.url("/detokenize"), json={"tokens": tok["tokens"][1:]}, timeout=10).json()
    assert d["prompt"].strip() == prompt


def test_streaming_matches_non_streaming(stories_server):
    client = openai_client(stories_server)
    name = model_name(stories_server)
    full = client.completions.create(model=name, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    chunks = list(client.completions.create(model=name, prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert all(ch.object == "text_completion" and ch.id == chunks[0].id for ch in chunks)
    text_chunks = [ch for ch in chunks if ch.choices]
    assert "".join(ch.choices[0].text for ch in text_chunks) == full
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(ch.choices[0].finish_reason is None for ch in text_chunks[:-1])
    assert len(text_chunks) > 3  # streamed, not one block
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 24 and usage.usage.prompt_tokens == 5
    assert all(ch.usage is None for ch in chunks[:-1])


def test_stream_raw_sse_format(stories_server):
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    with requests.post(stories_server.url("/v1/completions"), json=body, stream=True, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = r.content.decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for e in events[:-2]:
        assert e.startswith("data: ")
        json.loads(e[len("data: "):])


def test_prompt_batches_and_n(stories_server):
    c = complete(stories_server, prompt=[PROMPT, "The cat"], n=2, max_tokens=8)
    assert [ch["index"] for ch in c["choices"]] == [0, 1, 2, 3]
    t = [ch["text"] for ch in c["choices"]]
    assert t[0] == t[1] and t[2] == t[3]  # greedy: n copies
    assert t[0] == complete(stories_server, max_tokens=8)["choices"][0]["text"]
    assert t[2] == complete(stories_server, prompt="The cat", max_tokens=8)["choices"][0]["text"]
    assert c["usage"]["completion_tokens"] == 4 * 8 or all(ch["finish_reason"] for ch in c["choices"])
    # Prompt tokens count each prompt once.
    n1 = requests.post(stories_server.url("/tokenize"), json={"prompt": PROMPT}, timeout=10).json()["count"]
    n2 = requests.post(stories_server.url("/tokenize"), json={"prompt": "The cat"}, timeout=10).json()["count"]
    assert c["usage"]["prompt_tokens"] == n1 + n2
    # Lists of token-id lists work too.
    ids = requests.post(stories_server.url("/tokenize"), json={"prompt": PROMPT}, timeout=10).json()["tokens"]
    c2 = complete(stories_server, prompt=[ids, ids], max_tokens=8)
    assert [ch["text"] for ch in c2["choices"]] == [t[0], t[0]]


def test_n_sampled_streaming(stories_server):
    client = openai_client(stories_server)
    chunks = list(client.completions.create(model="stories260K", prompt=PROMPT, max_tokens=16, temperature=1.0,
                                            n=4, seed=7, stream=True))
    texts = {}
    finish = {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert sorted(texts) == [0, 1, 2, 3] and sorted(finish) == [0, 1, 2, 3]
    assert len(set(texts.values())) > 1  # independent samples


def test_seed_reproducible(stories_server):
    kw = dict(max_tokens=24, temperature=1.0, top_p=0.95)
    a = complete(stories_server, seed=1234, **kw)["choices"][0]["text"]
    b = complete(stories_server, seed=1234, **kw)["choices"][0]["text"]
    assert a == b
    others = {complete(stories_server, seed=s, **kw)["choices"][0]["text"] for s in (1, 2, 3)}
    assert len(others | {a}) > 1


def test_stop_strings(stories_server):
    c = complete(stories_server, max_tokens=40, stop=["Lily"])
    ch = c["choices"][0]
    assert ch["text"] == ", there was a little girl named "
    assert ch["finish_reason"] == "stop" and ch["stop_reason"] == "Lily"
    c = complete(stories_server, max_tokens=40, stop=["Lily"], include_stop_str_in_output=True)
    assert c["choices"][0]["text"] == ", there was a little girl named Lily"
    # Streaming holds back a partial stop string and never emits it.
    client = openai_client(stories_server)
    chunks = list(client.completions.create(model="stories260K", prompt=PROMPT, max_tokens=40, temperature=0,
                                            stop=["girl named"], stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ", there was a little "
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_token_ids(stories_server):
    ids = requests.post(stories_server.url("/tokenize"), json={"prompt": "Lily", "add_special_tokens": False},
                        timeout=10).json()["tokens"]
    c = complete(stories_server, max_tokens=40, stop_token_ids=[ids[0]])
    ch = c["choices"][0]
    assert ch["finish_reason"] == "stop" and ch["stop_reason"] == ids[0]


def test_logprobs(stories_server):
    c = complete(stories_server, max_tokens=10, logprobs=3)
    ch = c["choices"][0]
    lp = ch["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 10
    assert "".join(lp["tokens"]) == ch["text"]
    assert lp["text_offset"][0] == 0
    assert all(b > a for a, b in zip(lp["text_offset"], lp["text_offset"][1:]))
    for tok, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert logprob <= 0
        assert 3 <= len(top) <= 4 and tok in top
        assert abs(max(top.values()) - logprob) < 1e-4  # greedy picks the most likely token
    # Streaming logprobs continue the offsets.
    chunks = list(openai_client(stories_server).completions.create(
        model="stories260K", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3, stream=True))
    offsets = [o for ch in chunks if ch.choices and ch.choices[0].logprobs for o in ch.choices[0].logprobs.text_offset]
    assert offsets == lp["text_offset"]


def test_echo(stories_server):
    c = complete(stories_server, max_tokens=8, echo=True)
    plain = complete(stories_server, max_tokens=8)
    assert c["choices"][0]["text"] == PROMPT + plain["choices"][0]["text"]
    chunks = list(openai_client(stories_server).completions.create(
        model="stories260K", prompt=PROMPT, max_tokens=8, temperature=0, echo=True, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c["choices"][0]["text"]


def test_sampling_extensions_accepted(stories_server):
    c = complete(stories_server, temperature=0.8, top_k=20, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
                 frequency_penalty=0.5, min_tokens=4, seed=3, user="someone", priority=0,
                 logit_bias={"13": -100}, skip_special_tokens=True, unknown_field_is_ignored=[1, 2])
    assert c["usage"]["completion_tokens"] >= 4


def test_ignore_eos_and_max_tokens_default(stories_server):
    c = complete(stories_server, max_tokens=None, ignore_eos=True)
    assert c["usage"]["completion_tokens"] == 16  # OpenAI's default for completions
