"""Bad input to the CLI: one line naming the problem on stderr, a non-zero
exit, never a crash or a hang."""
import struct
import subprocess

import pytest

TIMEOUT = 60


def run(pagellm_bin, *args):
    p = subprocess.run([pagellm_bin, *args], capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr


def assert_one_line_error(code, err, *needles):
    assert code != 0, "expected a non-zero exit"
    assert code < 128, f"killed by a signal? exit {code}"
    lines = [l for l in err.strip().splitlines() if not l.startswith("info ")]
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    assert lines[0].startswith("error: "), lines[0]
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


def gguf_bytes(metadata, tensors):
    """A minimal GGUF v3 file: metadata (key, type, value) and tensors (name, dims, type, data)."""
    out = bytearray(b"GGUF") + struct.pack("<IQQ", 3, len(tensors), len(metadata))

    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    for key, typ, val in metadata:
        out += s(key) + struct.pack("<I", typ)
        if typ == 8:
            out += s(val)
        elif typ == 4:
            out += struct.pack("<I", val)
        elif typ == 6:
            out += struct.pack("<f", val)
    offset = 0
    infos = bytearray()
    blobs = []
    for name, dims, ttype, data in tensors:
        infos += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", ttype, offset)
        blobs.append(data)
        offset += (len(data) + 31) // 32 * 32
    out += infos
    out += b"\0" * ((32 - len(out) % 32) % 32)
    for b in blobs:
        out += b + b"\0" * ((32 - len(b) % 32) % 32)
    return bytes(out)


def llama_meta(arch="llama"):
    return [("general.architecture", 8, arch), (f"{arch}.embedding_length", 4, 256),
            (f"{arch}.block_count", 4, 1), (f"{arch}.feed_forward_length", 4, 512),
            (f"{arch}.attention.head_count", 4, 4), (f"{arch}.context_length", 4, 64),
            (f"{arch}.vocab_size", 4, 512)]


def test_missing_model_file(pagellm_bin, tmp_path):
    code, _, err = run(pagellm_bin, "generate", "-m", str(tmp_path / "nope.gguf"), "-p", "hi")
    assert_one_line_error(code, err, "nope.gguf", "does not exist")


def test_not_a_gguf_file(pagellm_bin, tmp_path):
    f = tmp_path / "junk.gguf"
    f.write_bytes(b"this is not a model at all")
    code, _, err = run(pagellm_bin, "generate", "-m", str(f), "-p", "hi")
    assert_one_line_error(code, err, "not a GGUF file")


def test_truncated_model(pagellm_bin, stories_model, tmp_path):
    data = open(stories_model, "rb").read()
    f = tmp_path / "truncated.gguf"
    f.write_bytes(data[: len(data) // 2])
    code, _, err = run(pagellm_bin, "generate", "-m", str(f), "-p", "hi")
    assert_one_line_error(code, err, "truncated")


def test_unknown_architecture(pagellm_bin, tmp_path):
    f = tmp_path / "mamba.gguf"
    f.write_bytes(gguf_bytes(llama_meta("mamba"), []))
    code, _, err = run(pagellm_bin, "generate", "-m", str(f), "-p", "hi")
    assert_one_line_error(code, err, "unsupported architecture 'mamba'")


def test_unsupported_tensor_type(pagellm_bin, tmp_path):
    # IQ2_XXS (type 16): 66 bytes per 256 values.
    embd = ("token_embd.weight", [256, 512], 16, b"\1" * (66 * 512))
    f = tmp_path / "iq2.gguf"
    f.write_bytes(gguf_bytes(llama_meta(), [embd]))
    code, _, err = run(pagellm_bin, "generate", "-m", str(f), "-p", "hi")
    assert_one_line_error(code, err, "token_embd.weight", "IQ2_XXS")


def test_missing_tensor(pagellm_bin, tmp_path):
    embd = ("token_embd.weight", [256, 512], 0, b"\0" * (4 * 256 * 512))
    f = tmp_path / "partial.gguf"
    f.write_bytes(gguf_bytes(llama_meta(), [embd]))
    code, _, err = run(pagellm_bin, "generate", "-m", str(f), "-p", "hi")
    assert_one_line_error(code, err, "missing tensor", "output_norm.weight")


def test_prompt_longer_than_context(pagellm_bin, stories_model):
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "--max-model-len", "16",
                       "-p", "Once upon a time there was a very long prompt that does not fit at all", "-n", "4")
    assert_one_line_error(code, err, "maximum context length is 16")


def test_prompt_plus_max_tokens_beyond_context(pagellm_bin, stories_model):
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "Once upon a time", "-n", "600")
    assert_one_line_error(code, err, "maximum context length is 512", "max_tokens")


@pytest.mark.parametrize("flags, needle", [
    (["--temp", "-1"], "temperature"),
    (["--top-p", "1.5"], "top_p"),
    (["--top-k", "-5"], "top_k"),
    (["--min-p", "2"], "min_p"),
    (["-n", "0"], "max-tokens"),
    (["--block-size", "7"], "block-size"),
    (["--kv-cache-memory", "lots"], "lots"),
    (["--threads", "-2"], "threads"),
    (["--kv-cache-dtype", "q3"], "kv-cache-dtype"),
    (["--no-such-flag"], "no-such-flag"),
])
def test_invalid_flag_values(pagellm_bin, stories_model, flags, needle):
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "hi", *flags)
    assert_one_line_error(code, err, needle)


def test_kv_budget_too_small(pagellm_bin, stories_model):
    code, _, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "hi", "--kv-cache-memory", "1KiB")
    assert_one_line_error(code, err)


def test_tokenize_vocab_only_file(pagellm_bin, stories_model):
    code, out, err = run(pagellm_bin, "tokenize", "-m", stories_model, "Once upon a time")
    assert code == 0, err
    assert out.strip() == "[1, 403, 407, 261, 378]"


def test_generate_works(pagellm_bin, stories_model):
    code, out, err = run(pagellm_bin, "generate", "-m", stories_model, "-p", "Once upon a time", "-n", "24",
                         "--temp", "0")
    assert code == 0, err
    assert out.startswith(", there was a little girl named Lily")
    assert "tokens/s" in err


def test_generate_batch_jsonl(pagellm_bin, stories_model, tmp_path):
    f = tmp_path / "batch.jsonl"
    f.write_text('{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}\n'
                 '{"prompt": "Lily and Ben", "max_tokens": 4, "temperature": 0, "stop": ["."]}\n'
                 'not json\n'
                 '{"prompt": "Tom", "max_tokens": 5, "temperature": -3}\n')
    code, out, err = run(pagellm_bin, "generate", "-m", stories_model, "--batch", str(f))
    assert code == 0, err
    import json
    lines = [json.loads(l) for l in out.strip().splitlines()]
    assert [l["index"] for l in lines] == [0, 1, 2, 3]
    assert lines[0]["text"].startswith(", there was a little girl")
    assert lines[0]["completion_tokens"] == 8 and lines[0]["finish_reason"] == "length"
    assert lines[0]["prompt_tokens"] == 5 and len(lines[0]["token_ids"]) == 8
    assert "error" in lines[2] and "JSON" in lines[2]["error"]
    assert "error" in lines[3] and "temperature" in lines[3]["error"]


def test_generate_batch_chat_lines(pagellm_bin, stories_model, tmp_path):
    """Batch lines are parsed like the server's bodies: a line with "messages" is a
    chat completion through the chat template, "prompt" a completion."""
    import json
    f = tmp_path / "batch.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "Once upon a time"}],
                             "max_tokens": 6, "temperature": 0}) + "\n"
                 + json.dumps({"prompt": ["a", "b"], "max_tokens": 2}) + "\n"
                 + json.dumps({"messages": "hi"}) + "\n")
    code, out, err = run(pagellm_bin, "generate", "-m", stories_model, "--batch", str(f))
    assert code == 0, err
    lines = [json.loads(l) for l in out.strip().splitlines()]
    assert "chat template" in lines[0]["error"]  # stories260K ships none
    assert "one prompt" in lines[1]["error"]
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    code, out, err = run(pagellm_bin, "generate", "-m", stories_model, "--batch", str(f),
                         "--chat-template", template)
    assert code == 0, err
    first, _, third = [json.loads(l) for l in out.strip().splitlines()]
    assert "messages" in third["error"]
    assert first["completion_tokens"] == 6 and first["finish_reason"] == "length", first
    assert first["prompt_tokens"] == 4  # the rendered text, without BOS (add_special_tokens false)
