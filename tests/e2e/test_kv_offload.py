"""The KV offload tier's disk tier across restarts: a server started again
on the same --kv-offload-dir finds a long prompt's prefix there
(usage.prompt_tokens_details.cached_tokens > 0) and answers as before; a
tampered block file is ignored with a warning, never loaded, and the answer
is still the same."""

import shutil
import tempfile
from pathlib import Path

import pytest
import requests

import prom
from conftest import STORIES, Server

# ~300 tokens of stories260K's vocabulary: 18 full blocks of 16.
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
          "friends. One day, she saw a big red ball under a tree and ran to get it. ") * 5


def complete(server):
    r = requests.post(server.url("/v1/completions"), json={
        "prompt": PROMPT, "max_tokens": 24, "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    cached = (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return body["choices"][0]["text"], cached, body["usage"]["prompt_tokens"]


def metrics(server):
    return prom.parse(requests.get(server.url("/metrics"), timeout=10).text)


@pytest.fixture()
def offload_dir():
    d = Path(tempfile.mkdtemp(prefix="pagellm-kv-offload-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def serve(offload_dir, *extra):
    return Server(["--kv-offload-dir", str(offload_dir), "--kv-offload-disk-gb", "1", *extra]).start()


def test_a_restart_finds_the_prefix_on_disk(offload_dir):
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    first = serve(offload_dir)
    try:
        text, cached, prompt_tokens = complete(first)
        assert prompt_tokens > 200
        assert cached == 0
        assert "KV offload tier: disk" in first.output()
    finally:
        assert first.stop() == 0, first.output()
    files = list(offload_dir.glob("*/*.kvb"))
    assert len(files) >= (prompt_tokens - 1) // 16

    second = serve(offload_dir)
    try:
        assert "blocks found" in second.output()
        again, cached, _ = complete(second)
        assert again == text
        assert cached == (prompt_tokens - 1) // 16 * 16
        m = metrics(second)
        assert prom.value(m, "pagellm:kv_offload_hit_tokens_total") == cached
        assert prom.value(m, "pagellm:kv_offload_loaded_blocks_total", tier="disk") >= cached // 16
        assert prom.value(m, "pagellm:prefix_cache_hits_total") >= cached
    finally:
        assert second.stop() == 0, second.output()


def test_a_tampered_block_is_never_loaded(offload_dir):
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    first = serve(offload_dir)
    try:
        text, _, prompt_tokens = complete(first)
    finally:
        assert first.stop() == 0, first.output()
    files = sorted(offload_dir.glob("*/*.kvb"))
    assert files
    # Flip a byte in every block's payload (its header stays valid: the scan
    # keeps the files, the load finds the checksums wrong).
    for f in files:
        data = bytearray(f.read_bytes())
        data[-5] ^= 0x5A
        f.write_bytes(bytes(data))
    # And one file that is no block at all.
    (files[0].parent / ("0" * 32 + ".kvb")).write_bytes(b"not a block")

    second = serve(offload_dir)
    try:
        again, cached, _ = complete(second)
        assert again == text
        assert cached == 0
        log = second.output()
        assert "ignoring and deleting" in log
        assert "payload checksum mismatch" in log
        m = metrics(second)
        assert prom.value(m, "pagellm:kv_offload_rejected_files_total", tier="disk") >= 2
        assert prom.value(m, "pagellm:kv_offload_hit_tokens_total") == 0
    finally:
        assert second.stop() == 0, second.output()


def test_an_unusable_dir_is_a_warning_and_serving_goes_on(offload_dir):
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    blocker = offload_dir / "a-file"
    blocker.write_text("x")
    s = serve(blocker / "kv")
    try:
        text, cached, _ = complete(s)
        assert text
        assert "the disk tier is off" in s.output()
    finally:
        assert s.stop() == 0, s.output()
