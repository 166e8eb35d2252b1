"""Values that JSON or C++ strings cannot carry: a NaN or an infinity in any
float, a lone surrogate in any string. Each raises ValueError naming the
field at the entry point that takes it, before anything reaches the engine;
the engine keeps working after them."""

import asyncio
import math
import re

import pytest

from conftest import ENGINE_ARGS
from pagellm import LLM, AsyncLLM, SamplingParams, StructuredOutputsParams

NOT_FINITE = [math.nan, math.inf, -math.inf]
SAMPLING_FLOATS = ["presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "min_p"]
# Integer fields given a float: the same check (the engine would refuse them,
# but only after a JSON parse error naming nothing).
SAMPLING_INTS = ["n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs"]
ENGINE_FLOATS = ["gpu_memory_utilization", "swap_space", "max_model_len", "kv_cache_memory", "seed"]
LONE = "abc\ud800def"  # U+D800 at index 3
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


def not_finite(field, value):
    return re.escape(f"{field} must be a finite number, got {value!r}")


def lone_surrogate(field):
    return re.escape(f"{field} must be valid Unicode text: the lone surrogate U+D800 at index 3")


@pytest.fixture(scope="module")
def chat_llm(stories_path):
    return LLM(model=stories_path, chat_template=TEMPLATE, **ENGINE_ARGS)


@pytest.fixture(scope="module")
def async_llm(stories_path):
    e = AsyncLLM(model=stories_path, **ENGINE_ARGS)
    yield e
    e.shutdown()


def still_works(llm):
    assert llm._engine.num_in_flight == 0
    assert len(llm.generate("Once", SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids) == 2


# ---- floats: SamplingParams


@pytest.mark.parametrize("value", NOT_FINITE, ids=repr)
@pytest.mark.parametrize("field", SAMPLING_FLOATS + SAMPLING_INTS)
def test_sampling_field_not_finite(field, value):
    with pytest.raises(ValueError, match=not_finite(field, value)):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("value", NOT_FINITE, ids=repr)
def test_nested_sampling_values_not_finite(value):
    with pytest.raises(ValueError, match=not_finite("logit_bias[5]", value)):
        SamplingParams(logit_bias={3: 1.0, 5: value})
    with pytest.raises(ValueError, match=re.escape("structured_outputs.json['properties']['x']['maximum'] must")):
        SamplingParams(structured_outputs=StructuredOutputsParams(
            json={"type": "object", "properties": {"x": {"type": "number", "maximum": value}}}))
    with pytest.raises(ValueError, match=re.escape("guided_decoding['json']['enum'][1] must be a finite number")):
        SamplingParams(guided_decoding={"json": {"enum": [1.0, value]}})


@pytest.mark.parametrize("value", NOT_FINITE, ids=repr)
@pytest.mark.parametrize("field", SAMPLING_FLOATS + ["logit_bias"])
def test_sampling_field_set_after_construction(llm, field, value):
    # A dataclass field may change after __init__: generate checks again.
    sp = SamplingParams(max_tokens=2)
    setattr(sp, field, {7: value} if field == "logit_bias" else value)
    with pytest.raises(ValueError, match=not_finite("logit_bias[7]" if field == "logit_bias" else field, value)):
        llm.generate("Once", sp, use_tqdm=False)
    still_works(llm)


@pytest.mark.parametrize("value", NOT_FINITE, ids=repr)
def test_priority_not_finite(llm, value):
    with pytest.raises(ValueError, match=not_finite("priority", value)):
        llm.generate(["Once"], SamplingParams(max_tokens=2), use_tqdm=False, priority=[value])
    still_works(llm)


# ---- floats: engine arguments (checked before anything loads, so the model
# path need not exist)


@pytest.mark.parametrize("value", NOT_FINITE, ids=repr)
@pytest.mark.parametrize("field", ENGINE_FLOATS)
@pytest.mark.parametrize("cls", [LLM, AsyncLLM])
def test_engine_argument_not_finite(cls, field, value):
    with pytest.raises(ValueError, match=not_finite(field, value)):
        cls(model="/nonexistent/model.gguf", **{field: value})


@pytest.mark.parametrize("value", NOT_FINITE, ids=repr)
def test_nested_engine_arguments_not_finite(value):
    with pytest.raises(ValueError, match=not_finite("speculative_config['prompt_lookup_max']", value)):
        LLM(model="/nonexistent/model.gguf", speculative_config={"method": "ngram", "prompt_lookup_max": value})
    with pytest.raises(ValueError, match=not_finite("backend_options['scale']", value)):
        LLM(model="/nonexistent/model.gguf", backend_options={"scale": value})


# ---- lone surrogates, at each entry point


def test_lone_surrogate_in_prompts(llm):
    with pytest.raises(ValueError, match=lone_surrogate("prompt 0")):
        llm.generate(LONE, use_tqdm=False)
    with pytest.raises(ValueError, match=lone_surrogate("prompt 1")):
        llm.generate(["Once", {"prompt": LONE}], use_tqdm=False)
    still_works(llm)


@pytest.mark.parametrize("kwargs, field", [
    ({"stop": LONE}, "stop[0]"),
    ({"stop": ["\n", LONE]}, "stop[1]"),
    ({"structured_outputs": StructuredOutputsParams(regex=LONE)}, "structured_outputs.regex"),
    ({"structured_outputs": StructuredOutputsParams(choice=["yes", LONE])}, "structured_outputs.choice[1]"),
    ({"structured_outputs": StructuredOutputsParams(json={"title": LONE})}, "structured_outputs.json['title']"),
    ({"guided_decoding": {"grammar": LONE}}, "guided_decoding['grammar']"),
])
def test_lone_surrogate_in_sampling_params(llm, kwargs, field):
    with pytest.raises(ValueError, match=lone_surrogate(field)):
        SamplingParams(**kwargs)
    sp = SamplingParams(max_tokens=2)
    for k, v in kwargs.items():
        setattr(sp, k, [v] if k == "stop" and isinstance(v, str) else v)
    with pytest.raises(ValueError, match=lone_surrogate(field)):
        llm.generate("Once", sp, use_tqdm=False)
    still_works(llm)


def test_lone_surrogate_in_chat(chat_llm):
    ok = [{"role": "user", "content": "Tell me a story."}]
    bad = [{"role": "user", "content": LONE}]
    with pytest.raises(ValueError, match=lone_surrogate("messages[0]['content']")):
        chat_llm.chat(bad, use_tqdm=False)
    with pytest.raises(ValueError, match=lone_surrogate("messages[1][0]['content']")):
        chat_llm.chat([ok, bad], use_tqdm=False)
    with pytest.raises(ValueError, match=lone_surrogate("messages[0]['role']")):
        chat_llm.chat([{"role": LONE, "content": "hi"}], use_tqdm=False)
    with pytest.raises(ValueError, match=re.escape("a key of messages[0] must be valid Unicode text")):
        chat_llm.chat([{"role": "user", "content": "hi", "\ud800": 1}], use_tqdm=False)
    with pytest.raises(ValueError, match=lone_surrogate("tools[0]['function']['name']")):
        chat_llm.chat(ok, tools=[{"type": "function", "function": {"name": LONE}}], use_tqdm=False)
    with pytest.raises(ValueError, match=lone_surrogate("chat_template_kwargs['style']")):
        chat_llm.chat(ok, chat_template_kwargs={"style": LONE}, use_tqdm=False)
    with pytest.raises(ValueError, match=not_finite("chat_template_kwargs['t']", math.nan)):
        chat_llm.chat(ok, chat_template_kwargs={"t": math.nan}, use_tqdm=False)
    with pytest.raises(ValueError, match=lone_surrogate("messages[0]['content']")):
        chat_llm.get_tokenizer().apply_chat_template(bad)
    assert chat_llm.chat(ok, SamplingParams(max_tokens=2), use_tqdm=False)[0].prompt.startswith("user: Tell")
    assert chat_llm._engine.num_in_flight == 0


def test_lone_surrogate_in_tokenizer(llm):
    tok = llm.get_tokenizer()
    with pytest.raises(ValueError, match=lone_surrogate("text")):
        tok.encode(LONE)
    with pytest.raises(ValueError, match=lone_surrogate("text")):
        tok(LONE)
    assert tok.encode("caf\u00e9 \U0001F642", add_special_tokens=False)  # real non-ASCII text still encodes


def test_lone_surrogate_in_engine_arguments(stories_path):
    with pytest.raises(ValueError, match=lone_surrogate("model")):
        LLM(model=LONE)
    with pytest.raises(ValueError, match=lone_surrogate("chat_template")):
        LLM(model=stories_path, chat_template=LONE, **ENGINE_ARGS)
    with pytest.raises(ValueError, match=lone_surrogate("tokenizer")):
        AsyncLLM(model=stories_path, tokenizer=LONE, **ENGINE_ARGS)
    with pytest.raises(ValueError, match=re.escape("a key of backend_options must be valid Unicode text")):
        LLM(model=stories_path, backend_options={"\ud800": "1"}, **ENGINE_ARGS)


def test_lone_surrogate_in_async_llm(async_llm):
    async def last(prompt, sp=None, rid=None):
        return [out async for out in async_llm.generate(prompt, sp or SamplingParams(max_tokens=2), rid)][-1]

    with pytest.raises(ValueError, match=lone_surrogate("prompt 0")):
        asyncio.run(last(LONE))
    with pytest.raises(ValueError, match=lone_surrogate("request_id")):
        asyncio.run(last("Once", rid=LONE))
    sp = SamplingParams(max_tokens=2)
    sp.stop = [LONE]
    with pytest.raises(ValueError, match=lone_surrogate("stop[0]")):
        asyncio.run(last("Once", sp, rid="bad-stop"))
    sp = SamplingParams(max_tokens=2)
    sp.temperature = math.inf
    with pytest.raises(ValueError, match=not_finite("temperature", math.inf)):
        asyncio.run(last("Once", sp, rid="bad-temperature"))
    with pytest.raises(ValueError, match=lone_surrogate("request_id")):
        asyncio.run(async_llm.abort(LONE))
    with pytest.raises(ValueError, match=lone_surrogate("text")):
        asyncio.run(async_llm.get_tokenizer()).encode(LONE)
    # The ids of the failed requests are free again, and the engine works.
    assert asyncio.run(last("Once", rid="bad-stop")).finished
    assert async_llm._engine.num_in_flight == 0
