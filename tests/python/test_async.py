"""AsyncLLM: streaming (cumulative, delta, final only), concurrent requests
sharing batches, abort, a caller that leaves early, errors."""

import asyncio

import pytest

from conftest import ENGINE_ARGS
from pagellm import AsyncEngineArgs, AsyncLLM, AsyncLLMEngine, RequestOutputKind, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(stories_path):
    e = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=stories_path, **ENGINE_ARGS))
    yield e
    e.shutdown()


async def collect(engine, prompt, params, rid):
    return [out async for out in engine.generate(prompt, params, rid)]


def test_streams_cumulative_outputs(engine, llm):
    outs = asyncio.run(collect(engine, "Once upon a time", GREEDY, "cumulative"))
    assert len(outs) > 1 and outs[-1].finished and not any(o.finished for o in outs[:-1])
    lens = [len(o.outputs[0].token_ids) for o in outs]
    assert lens == sorted(lens) and lens[-1] == 24
    for a, b in zip(outs, outs[1:]):
        assert b.outputs[0].text.startswith(a.outputs[0].text)
    expected = llm.generate("Once upon a time", GREEDY, use_tqdm=False)[0].outputs[0]
    assert outs[-1].outputs[0].token_ids == expected.token_ids
    assert outs[-1].outputs[0].text == expected.text
    assert outs[-1].request_id == "cumulative" and outs[-1].prompt == "Once upon a time"


def test_delta_and_final_only(engine):
    full = asyncio.run(collect(engine, "Once upon a time", GREEDY, "full"))[-1].outputs[0]
    delta = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    parts = asyncio.run(collect(engine, "Once upon a time", delta, "delta"))
    assert "".join(p.outputs[0].text for p in parts) == full.text
    assert sum((p.outputs[0].token_ids for p in parts), []) == full.token_ids
    final = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    only = asyncio.run(collect(engine, "Once upon a time", final, "final"))
    assert len(only) == 1 and only[0].outputs[0].text == full.text


def test_concurrent_requests_share_the_engine(engine, llm):
    prompts = [f"Once upon a time {i}" for i in range(12)]

    async def main():
        return await asyncio.gather(*(collect(engine, p, GREEDY, f"c{i}") for i, p in enumerate(prompts)))

    results = asyncio.run(main())
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert [r[-1].outputs[0].token_ids for r in results] == expected
    assert engine.get_metrics()["num_requests_running"] == 0


def test_abort(engine):
    async def main():
        gen = engine.generate("Once", SamplingParams(max_tokens=200, ignore_eos=True), "to-abort")
        first = await gen.__anext__()
        await engine.abort("to-abort")
        rest = [o async for o in gen]
        return first, rest

    first, rest = asyncio.run(main())
    assert not first.finished
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    assert len(rest[-1].outputs[0].token_ids) < 200


def test_leaving_early_aborts(engine):
    async def main():
        async def consume():
            async for _ in engine.generate("Once", SamplingParams(max_tokens=200, ignore_eos=True), "cancelled"):
                await asyncio.sleep(0.01)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if engine._engine.num_in_flight == 0:
                return True
            await asyncio.sleep(0.02)
        return False

    assert asyncio.run(main())


def test_errors(engine):
    async def bad_params():
        return await collect(engine, "Once", SamplingParams(temperature=-2), "bad")

    with pytest.raises(ValueError, match="temperature"):
        asyncio.run(bad_params())

    async def duplicate():
        gen1 = engine.generate("Once", SamplingParams(max_tokens=200, ignore_eos=True), "dup")
        await gen1.__anext__()
        try:
            await collect(engine, "Once", GREEDY, "dup")
        finally:
            await gen1.aclose()

    with pytest.raises(ValueError, match="duplicate"):
        asyncio.run(duplicate())
    # The engine serves the next request as before.
    assert asyncio.run(collect(engine, "Once", GREEDY, "after"))[-1].finished


def test_shutdown(stories_path):
    e = AsyncLLM(model=stories_path, **ENGINE_ARGS)
    assert e.is_running
    e.shutdown()
    e.shutdown()  # idempotent
    assert not e.is_running
    with pytest.raises(RuntimeError):
        asyncio.run(collect(e, "Once", GREEDY, "late"))
