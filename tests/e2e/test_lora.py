"""LoRA adapters served with vLLM's flags and routes, through the official
`openai` client: adapters chosen by `model`, listed in /v1/models with their
parent, loaded and unloaded at run time under concurrent traffic, and the
errors vLLM gives (404 for an unknown adapter).

The base is the tiny Llama dummy (`make-dummy --format hf --shape tiny-llama
--seed 1`, the base of tests/fixtures/lora/tiny-llama); the adapters are the
fixture's PEFT folders, whose greedy continuations transformers + peft
computed (expected.json): each request's text must be those tokens'."""

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from conftest import BIN, REPO, Server

FIXTURES = REPO / "tests" / "fixtures" / "lora" / "tiny-llama"


@pytest.fixture(scope="module")
def ref():
    return json.loads((FIXTURES / "expected.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory, ref):
    if not BIN.exists():
        pytest.skip(f"missing binary {BIN} (build first)")
    d = tmp_path_factory.mktemp("lora")
    base, vocab = d / "tiny-llama", d / "vocab.gguf"
    make = [str(BIN), "make-dummy", "--shape", "tiny-llama", "--seed", str(ref["seed"]), "-t", "1"]
    subprocess.run([*make, "--format", "hf", "--type", "f32", "-o", str(base)], check=True, capture_output=True)
    subprocess.run([*make, "--type", "q8_0", "-o", str(vocab)], check=True, capture_output=True)  # its vocabulary
    s = Server(["--tokenizer", str(vocab), "--served-model-name", "tiny", "--kv-cache-dtype", "f32",
                "--max-model-len", "128", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
                "--lora-modules", f"ad-a={FIXTURES / 'a'}", json.dumps({"name": "ad-b", "path": str(FIXTURES / 'b')}),
                "--api-key", "k"], model=base).start()
    yield s
    assert s.stop() == 0, s.output()


def client(s):
    return openai.OpenAI(base_url=s.url("/v1"), api_key="k", max_retries=0)


def expected_text(s, ref, case):
    r = requests.post(s.url("/detokenize"), json={"tokens": ref["cases"][case]["greedy_ids"]},
                      headers={"Authorization": "Bearer k"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def complete(s, ref, model):
    out = client(s).completions.create(model=model, prompt=ref["greedy"]["prompt"], max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    return out.choices[0].text


def test_models_lists_adapters_with_their_parent(server):
    models = {m.id: m for m in client(server).models.list().data}
    assert set(models) == {"tiny", "ad-a", "ad-b"}
    assert models["ad-a"].model_extra["parent"] == "tiny"
    assert models["ad-a"].model_extra["root"] == str(FIXTURES / "a")
    assert client(server).models.retrieve("ad-b").id == "ad-b"


def test_each_adapter_gives_peft_greedy_text(server, ref):
    for model, case in [("tiny", "base"), ("ad-a", "a"), ("ad-b", "b")]:
        assert complete(server, ref, model) == expected_text(server, ref, case), model
    # The adapter changes the text where peft's does.
    assert expected_text(server, ref, "a") != expected_text(server, ref, "base")


def test_unknown_adapter_is_404(server, ref):
    with pytest.raises(openai.NotFoundError):
        complete(server, ref, "ad-zzz")


def test_load_and_unload_at_run_time_under_traffic(server, ref):
    h = {"Authorization": "Bearer k"}
    url = server.url
    # Without the key: refused as every /v1 route.
    assert requests.post(url("/v1/load_lora_adapter"), json={"lora_name": "ad-c", "lora_path": "x"},
                         timeout=30).status_code == 401
    want = {m: expected_text(server, ref, c) for m, c in [("tiny", "base"), ("ad-a", "a"), ("ad-b", "b"),
                                                         ("ad-c", "c")]}
    with ThreadPoolExecutor(6) as pool:
        # Traffic on the base and both adapters while a third is loaded (three
        # adapters, two slots: some wait for a slot).
        busy = [pool.submit(complete, server, ref, m) for m in ["tiny", "ad-a", "ad-b"] * 3]
        r = requests.post(url("/v1/load_lora_adapter"), json={"lora_name": "ad-c", "lora_path": str(FIXTURES / "c")},
                          headers=h, timeout=60)
        assert r.status_code == 200, r.text
        more = [pool.submit(complete, server, ref, "ad-c") for _ in range(3)]
        for f, m in zip(busy, ["tiny", "ad-a", "ad-b"] * 3):
            assert f.result() == want[m], m
        for f in more:
            assert f.result() == want["ad-c"]
    # Taken, bad files, unknown names: clear errors.
    r = requests.post(url("/v1/load_lora_adapter"), json={"lora_name": "ad-c", "lora_path": str(FIXTURES / "c")},
                      headers=h, timeout=30)
    assert r.status_code == 400 and "already loaded" in r.json()["error"]["message"]
    r = requests.post(url("/v1/load_lora_adapter"), json={"lora_name": "ad-x", "lora_path": "/nonexistent"},
                      headers=h, timeout=30)
    assert r.status_code == 400 and "does not exist" in r.json()["error"]["message"]
    r = requests.post(url("/v1/load_lora_adapter"), json={"lora_name": "ad-x"}, headers=h, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"
    # A Qwen3 adapter does not fit this Llama.
    r = requests.post(url("/v1/load_lora_adapter"),
                      json={"lora_name": "ad-q", "lora_path": str(REPO / "tests/fixtures/lora/tiny-qwen3/a.gguf")},
                      headers=h, timeout=30)
    assert r.status_code == 400 and "qwen3" in r.json()["error"]["message"]
    r = requests.post(url("/v1/unload_lora_adapter"), json={"lora_name": "ad-c"}, headers=h, timeout=30)
    assert r.status_code == 200, r.text
    with pytest.raises(openai.NotFoundError):
        complete(server, ref, "ad-c")
    assert "ad-c" not in {m.id for m in client(server).models.list().data}
    r = requests.post(url("/v1/unload_lora_adapter"), json={"lora_name": "ad-c"}, headers=h, timeout=30)
    assert r.status_code == 404
    # The others still serve.
    assert complete(server, ref, "ad-a") == want["ad-a"]


def test_metrics_show_lora_requests_info(server):
    text = requests.get(server.url("/metrics"), timeout=30).text
    line = next(l for l in text.splitlines() if l.startswith("pagellm:lora_requests_info{"))
    assert 'max_lora="2"' in line and 'running_lora_adapters=""' in line


def test_without_enable_lora_the_routes_refuse(ref):
    s = Server(["--max-model-len", "64"]).start()
    try:
        r = requests.post(s.url("/v1/load_lora_adapter"), json={"lora_name": "a", "lora_path": str(FIXTURES / "a")},
                          timeout=30)
        assert r.status_code == 400 and "--enable-lora" in r.json()["error"]["message"]
    finally:
        assert s.stop() == 0, s.output()
