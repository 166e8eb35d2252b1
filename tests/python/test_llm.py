"""LLM: the same greedy output as the CLI, batches, prompts as ids, samples,
logprobs, chat, the tokenizer, threads, structured outputs."""

import threading

import pytest

from conftest import ENGINE_ARGS, cli_greedy
from pagellm import LLM, RequestOutput, SamplingParams, StructuredOutputsParams

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park", "One day, a bird"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def test_greedy_matches_cli_stories(llm, stories_path):
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == cli_greedy(stories_path, PROMPTS, 24)


def test_greedy_matches_cli_default_model(gemma_path):
    prompts = ["The capital of France is", "def fibonacci(n):"]
    llm = LLM(model=gemma_path, num_threads=2, max_model_len=512)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == cli_greedy(gemma_path, prompts, 16)
    assert all(len(o.outputs[0].text) > 0 for o in outs)


def test_output_shape(llm):
    out = llm.generate("Once upon a time", GREEDY, use_tqdm=False)
    assert len(out) == 1 and isinstance(out[0], RequestOutput)
    o = out[0]
    assert o.prompt == "Once upon a time"
    assert o.prompt_token_ids == llm.get_tokenizer().encode("Once upon a time")
    assert o.finished
    c = o.outputs[0]
    assert c.index == 0 and len(c.token_ids) == 24 and c.finish_reason == "length" and c.stop_reason is None
    assert c.text == llm.get_tokenizer().decode(c.token_ids)
    assert c.logprobs is None and c.cumulative_logprob is None
    m = o.metrics
    assert m.arrival_time <= m.first_token_time <= m.finished_time
    assert m.num_generation_tokens == 24


def test_many_prompts_in_one_batch(llm):
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(64)]
    params = [SamplingParams(temperature=0, max_tokens=4 + i % 13, ignore_eos=True) for i in range(64)]
    outs = llm.generate(prompts, params, use_tqdm=True)
    assert [o.prompt for o in outs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outs] == [4 + i % 13 for i in range(64)]
    alone = [llm.generate(prompts[i], params[i], use_tqdm=False)[0].outputs[0].token_ids for i in (0, 17, 63)]
    assert alone == [outs[i].outputs[0].token_ids for i in (0, 17, 63)]


def test_token_id_prompts(llm):
    ids = llm.get_tokenizer().encode("Once upon a time")
    by_ids = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    by_text = llm.generate({"prompt": "Once upon a time"}, GREEDY, use_tqdm=False)[0]
    assert by_ids.prompt is None and by_ids.prompt_token_ids == ids
    assert by_ids.outputs[0].token_ids == by_text.outputs[0].token_ids


def test_samples_seeds_and_logprobs(llm):
    sp = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True, logprobs=2)
    a = llm.generate("Once upon a time", sp, use_tqdm=False)[0]
    b = llm.generate("Once upon a time", sp, use_tqdm=False)[0]
    assert [c.index for c in a.outputs] == [0, 1, 2]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]  # seeded
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1  # n samples differ
    for c in a.outputs:
        assert len(c.logprobs) == len(c.token_ids) == 12
        for tok, entry in zip(c.token_ids, c.logprobs):
            assert tok in entry and entry[tok].logprob <= 0
            assert entry[tok].decoded_token is not None
            ranks = sorted(lp.rank for lp in entry.values() if lp.rank is not None)
            assert ranks[:1] == [1]
        assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)))


def test_logprobs_of_a_forced_token_outside_the_top(llm):
    # Token 233 is one byte of a multi-byte character; the bias forces it, the
    # logprobs are the model's own, where it is far from the top.
    sp = SamplingParams(temperature=0, max_tokens=2, logprobs=3, ignore_eos=True, logit_bias={233: 100.0})
    c = llm.generate("Once", sp, use_tqdm=False)[0].outputs[0]
    assert c.token_ids == [233, 233]
    first = c.logprobs[0]
    assert next(iter(first)) == 233  # the chosen token first, as vLLM orders them
    assert first[233].rank is None and first[233].decoded_token == "\ufffd"  # half a character
    assert sorted(lp.rank for t, lp in first.items() if t != 233) == [1, 2, 3]
    assert c.cumulative_logprob == sum(e[233].logprob for e in c.logprobs)


def test_prompt_logprobs_score_what_was_generated(llm):
    # Greedy tokens with their logprobs, then the same text as a prompt: its
    # prompt logprobs score those tokens again (the cached prompt is not used).
    gen = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8, logprobs=0, ignore_eos=True),
                       use_tqdm=False)[0]
    ids = gen.prompt_token_ids + gen.outputs[0].token_ids
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    lps = out.prompt_logprobs
    assert len(lps) == len(ids) and lps[0] is None
    assert out.num_cached_tokens == 0
    n = len(gen.prompt_token_ids)
    for k, token in enumerate(gen.outputs[0].token_ids):
        scored = lps[n + k]
        assert scored[token].rank == 1  # greedy
        assert scored[token].logprob == pytest.approx(gen.outputs[0].logprobs[k][token].logprob, abs=1e-3)
        assert sorted(lp.rank for lp in scored.values()) == [1, 2]
    assert llm.generate({"prompt_token_ids": ids[:1]}, SamplingParams(max_tokens=1, prompt_logprobs=0),
                        use_tqdm=False)[0].prompt_logprobs == [None]
    assert gen.prompt_logprobs is None


def test_engine_seed_makes_runs_reproducible(stories_path):
    sp = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    runs = []
    for _ in range(2):
        llm = LLM(model=stories_path, seed=1234, **ENGINE_ARGS)
        runs.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp, use_tqdm=False)])
    assert runs[0] == runs[1]


def test_stop_strings_and_max_tokens_none(llm):
    free = llm.generate("Once upon a time", GREEDY, use_tqdm=False)[0].outputs[0].text
    word = free.split()[2]
    out = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=24, stop=word),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == word
    assert out.text == free[:free.find(word)]
    room = llm.generate("Once", SamplingParams(temperature=0, max_tokens=None, ignore_eos=True), use_tqdm=False)[0]
    assert len(room.prompt_token_ids) + len(room.outputs[0].token_ids) == llm.max_model_len


def test_structured_choice(llm):
    sp = SamplingParams(temperature=1.0, seed=5, max_tokens=8,
                        structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe"]))
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    assert all(o.outputs[0].text in ("yes", "no", "maybe") for o in outs)
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)


def test_chat_with_a_template(stories_path):
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    llm = LLM(model=stories_path, chat_template=template, **ENGINE_ARGS)
    msgs = [{"role": "user", "content": "Tell me a story."}]
    out = llm.chat(msgs, GREEDY, use_tqdm=False)[0]
    rendered = llm.get_tokenizer().apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered == "user: Tell me a story.\nassistant:"
    assert out.prompt == rendered
    direct = llm.generate({"prompt_token_ids": llm.get_tokenizer().encode(rendered, add_special_tokens=False)},
                          GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == direct.outputs[0].token_ids
    two = llm.chat([msgs, msgs + [{"role": "assistant", "content": "Once"}, {"role": "user", "content": "More"}]],
                   GREEDY, use_tqdm=False)
    assert len(two) == 2


def test_chat_default_model(gemma_path):
    llm = LLM(model=gemma_path, num_threads=2, max_model_len=512)
    # The pretrained Gemma 3 270M answers after one example exchange.
    conversation = [{"role": "user", "content": "What is the capital of Germany?"},
                    {"role": "assistant", "content": "Berlin."},
                    {"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(conversation, SamplingParams(temperature=0, max_tokens=8, stop=["."]), use_tqdm=False)[0]
    assert "<start_of_turn>model" in out.prompt
    assert out.outputs[0].text.strip() == "Paris"


def test_tokenizer(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("Once upon a time")
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids).strip() == "Once upon a time"
    assert tok("Once upon a time")["input_ids"] == ids
    assert tok.encode("Once upon a time", add_special_tokens=False) == ids[1:]
    assert len(tok.convert_ids_to_tokens(ids)) == len(ids)
    assert tok.vocab_size == len(tok) > 0 and tok.eos_token_id is not None


def test_threads_share_one_llm(llm):
    expected = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    results, errors = {}, []

    def work(i):
        try:
            results[i] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert all(results[i] == expected for i in range(4))


def test_gil_is_released_while_generating(llm):
    done = threading.Event()
    t = threading.Thread(target=lambda: (llm.generate(PROMPTS * 4, SamplingParams(max_tokens=200, ignore_eos=True),
                                                      use_tqdm=False), done.set()))
    t.start()
    spins = 0
    while not done.is_set():
        spins += 1  # pure Python: runs only while the generating thread does not hold the GIL
    t.join()
    assert spins > 100_000


def test_metrics(llm):
    llm.generate("Once", GREEDY, use_tqdm=False)
    m = llm.get_metrics()
    assert m["generation_tokens"] >= 24 and m["num_requests_running"] == 0
