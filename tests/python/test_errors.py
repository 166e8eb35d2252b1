"""Bad arguments are Python exceptions with the engine's message, never a
crash; the engine keeps working after them; Ctrl-C stops a generate cleanly."""

import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import ENGINE_ARGS, REPO
from pagellm import LLM, SamplingParams


def test_bad_engine_arguments(stories_path):
    with pytest.raises(ValueError, match="max_num_seqz"):
        LLM(model=stories_path, max_num_seqz=4)
    with pytest.raises(ValueError, match="block_size"):
        LLM(model=stories_path, block_size=5)
    with pytest.raises(ValueError, match="kv_cache_memory"):
        LLM(model=stories_path, kv_cache_memory="lots")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(model=stories_path, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="speculative"):
        LLM(model=stories_path, speculative_config={"method": "ngram", "num_speculative_tokens": 99})
    with pytest.raises(ValueError, match="JSON"):
        LLM(model=stories_path, max_model_len=object())


def test_model_that_does_not_load(tmp_path):
    with pytest.raises(RuntimeError, match="nonexistent"):
        LLM(model="/nonexistent/model.gguf")
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(200))
    with pytest.raises(RuntimeError):
        LLM(model=str(bad))


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"n": 0}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"logprobs": 1000}, "logprobs"),
    ({"stop_token_ids": [10 ** 9]}, "stop_token_ids"),
    ({"logit_bias": {10 ** 9: 1.0}}, "logit_bias"),
])
def test_bad_sampling_params(llm, kwargs, field):
    with pytest.raises(ValueError, match=field):
        llm.generate("Once", SamplingParams(**kwargs), use_tqdm=False)


def test_bad_prompts(llm):
    with pytest.raises(ValueError, match="context length|maximum"):
        llm.generate("word " * 1000, use_tqdm=False)
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate({"prompt_token_ids": [1, 10 ** 9]}, use_tqdm=False)
    with pytest.raises(TypeError):
        llm.generate([[1, 2, 3]], use_tqdm=False)
    with pytest.raises(TypeError):
        llm.generate(42, use_tqdm=False)
    with pytest.raises(ValueError, match="sampling params"):
        llm.generate(["a", "b"], [SamplingParams()] * 3, use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        llm.generate("Once", SamplingParams(prompt_logprobs=21), use_tqdm=False)
    with pytest.raises(ValueError, match="chat template"):
        llm.chat([{"role": "user", "content": "hi"}], use_tqdm=False)  # stories260K has none
    with pytest.raises(ValueError, match="vocabulary"):
        llm.get_tokenizer().decode([10 ** 9])
    # Nothing was queued by the failures; the engine still works.
    assert len(llm.generate("Once", SamplingParams(max_tokens=3), use_tqdm=False)[0].outputs[0].token_ids) == 3
    assert llm._engine.num_in_flight == 0


def test_ctrl_c_in_process_stops_generate(stories_path):
    llm = LLM(model=stories_path, **ENGINE_ARGS)
    long = SamplingParams(max_tokens=250, ignore_eos=True)
    # Python's own handler, even when the tests were started with SIGINT
    # ignored (a background job of a script): interrupt_main does nothing then.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    t0 = time.time()
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(["Once upon a time"] * 256, long, use_tqdm=False)
    finally:
        signal.signal(signal.SIGINT, old)
    assert time.time() - t0 < 30
    deadline = time.time() + 10
    while llm._engine.num_in_flight and time.time() < deadline:
        time.sleep(0.05)
    assert llm._engine.num_in_flight == 0  # the aborted requests were freed
    assert len(llm.generate("Once", SamplingParams(max_tokens=3), use_tqdm=False)[0].outputs[0].token_ids) == 3


def test_ctrl_c_in_a_script_exits_cleanly(stories_path):
    script = textwrap.dedent(f"""
        import sys
        from pagellm import LLM, SamplingParams
        llm = LLM(model={stories_path!r}, num_threads=1, max_model_len=256)
        print("ready", flush=True)
        llm.generate(["Once upon a time"] * 512, SamplingParams(max_tokens=250, ignore_eos=True), use_tqdm=False)
        print("finished", flush=True)
    """)
    # (SIGINT back to its default in the child: Python keeps an ignored one ignored.)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    # Python ends an uncaught KeyboardInterrupt by dying of SIGINT itself (so
    # that the shell sees it); an abort (terminate) or a crash is a failure.
    assert proc.returncode == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err and "finished" not in out
    assert "terminate called" not in err
