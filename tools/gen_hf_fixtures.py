#!/usr/bin/env python3
"""Regenerates the Hugging Face loading fixtures in tests/fixtures/hf/.

For every tiny dummy shape and weight type, `pagellm make-dummy --format hf`
writes a Hugging Face folder (config.json + safetensors); transformers loads
it (float32 compute, eager attention) and runs a fixed token sequence. The
tests regenerate the same folder from C++, load it with pagellm and compare
the logits, so neither torch nor transformers is needed to run them.

  python3 tools/gen_hf_fixtures.py --pagellm build/pagellm

Fixtures:
  hf-<shape>-<type>[-<n>shards].json / .bin  float32 logits [n_tokens, n_vocab]
      for every position. The .json records the case, the tokens, the
      transformers version and, for F32 folders, the gap to llama.cpp running
      the GGUF dummy of the same seed (tests/fixtures/models): hf_writer
      un-permutes Llama Q/K and shifts Gemma norms, so both files are the same
      function and the gap is only float rounding.
      Gemma 3 / 4 F32 also record gelu_f16_table_gap: how far transformers moves
      when its GELU is replaced by the one pagellm and llama.cpp compute (a
      table over fp16 inputs holding fp16 outputs, up to 2^-11 relative per
      activation): the yardstick for the test's Gemma tolerance.
  config-<shape>.json  the folder's config.json as transformers saves it
      (transformers 5 writes rope_parameters instead of rope_theta /
      rope_local_base_freq); the tests check that both read to one config.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "hf")
MODEL_FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "models")

SHAPES = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-llama3", "tiny-gemma2", "tiny-phi3",
          "tiny-mixtral", "tiny-qwen2moe", "tiny-qwen3moe", "tiny-qwen3-yarn", "tiny-phi3-longrope", "tiny-gptoss",
          "tiny-qwen35", "tiny-qwen35moe", "tiny-deepseek3", "tiny-deepseek2", "tiny-glm4moe",
          "tiny-qwen3next", "tiny-gemma4", "tiny-gemma4moe", "tiny-gemma4g"]
# (shape, type, shards): every shape in F32 and BF16, plus a sharded F16 Llama
# (untied lm_head in the last shard, un-permuted Q/K).
CASES = [(s, t, 1) for s in SHAPES for t in ["f32", "bf16"]] + [("tiny-llama", "f16", 3)]
# gpt-oss as its checkpoints ship: MXFP4 experts (blocks + scales), the rest
# BF16; transformers dequantizes them (Mxfp4Config(dequantize=True)).
CASES += [("tiny-gptoss", "mxfp4", 1)]
SEED = 1
N_TOKENS = 40  # > 2 KV blocks of 16; > the tiny Gemma 3 sliding window (32)


def fixture_tokens():
    # The same sequence as tools/gen_model_fixtures.py uses for the GGUF dummies.
    rng = np.random.default_rng(1234)
    return [1] + [int(t) for t in rng.integers(3, 512, size=N_TOKENS - 1)]


def case_name(shape, wtype, shards):
    return f"hf-{shape}-{wtype}" + (f"-{shards}shards" if shards > 1 else "")


def max_rel_gap(a, b):
    """Per position: max |a - b| / max |b|, then the max over positions."""
    return float(np.max(np.max(np.abs(a - b), axis=1) / np.max(np.abs(b), axis=1)))


def load(folder, mxfp4=False):
    extra = {"quantization_config": transformers.Mxfp4Config(dequantize=True)} if mxfp4 else {}
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True, **extra)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"{folder}: transformers did not load every weight: {bad}")
    model.eval()
    return model


class GeluF16Table(torch.nn.Module):
    """GELU (tanh form) as a table over fp16 inputs with fp16 outputs, saturated beyond +-10."""

    def forward(self, x):
        y = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def run(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].to(torch.float32).numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True, help="path to the pagellm binary")
    ap.add_argument("--only", default="", help="comma-separated shapes to regenerate (default: all)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    torch.set_num_threads(2)
    os.makedirs(OUT, exist_ok=True)
    tokens = fixture_tokens()
    with tempfile.TemporaryDirectory() as tmp:
        for shape, wtype, shards in CASES:
            if only and shape not in only:
                continue
            name = case_name(shape, wtype, shards)
            folder = os.path.join(tmp, name)
            subprocess.run([args.pagellm, "make-dummy", "--format", "hf", "--shape", shape, "--type", wtype,
                            "--seed", str(SEED), "--shards", str(shards), "-o", folder], check=True)
            model = load(folder, mxfp4=wtype == "mxfp4")
            logits = run(model, tokens)
            meta = {"shape": shape, "type": wtype, "shards": shards, "seed": SEED, "tokens": tokens,
                    "n_vocab": int(logits.shape[1]),
                    "reference": f"transformers {transformers.__version__} (torch {torch.__version__}), "
                                 "float32, eager attention"}
            gguf_ref = os.path.join(MODEL_FIXTURES, f"dummy-{shape}-f32.bin")
            if wtype == "f32" and os.path.exists(gguf_ref):
                with open(os.path.join(MODEL_FIXTURES, f"dummy-{shape}-f32.json")) as f:
                    gguf_meta = json.load(f)
                if gguf_meta["tokens"] == tokens and gguf_meta["seed"] == SEED:
                    ref = np.fromfile(gguf_ref, dtype=np.float32).reshape(logits.shape)
                    meta["gap_to_llamacpp_gguf_dummy"] = max_rel_gap(logits, ref)
            if shape in ("tiny-gemma3", "tiny-gemma4", "tiny-gemma4g", "tiny-gemma4moe") and wtype == "f32":
                for layer in model.model.layers:
                    layer.mlp.act_fn = GeluF16Table()
                    if hasattr(layer, "experts"):  # Gemma 4's MoE block
                        layer.experts.act_fn = GeluF16Table()
                    if hasattr(layer, "per_layer_input_gate"):  # Gemma 4's per-layer input gate
                        layer.act_fn = GeluF16Table()
                meta["gelu_f16_table_gap"] = max_rel_gap(run(model, tokens), logits)
            logits.astype(np.float32).tofile(os.path.join(OUT, name + ".bin"))
            with open(os.path.join(OUT, name + ".json"), "w") as f:
                json.dump(meta, f, indent=1)
            print(name, "gap to llama.cpp GGUF:", meta.get("gap_to_llamacpp_gguf_dummy", "-"),
                  "fp16-table GELU gap:", meta.get("gelu_f16_table_gap", "-"))
            if wtype == "f32" and shards == 1:
                # config.json as transformers writes it (current field names).
                AutoConfig.from_pretrained(folder).to_json_file(os.path.join(OUT, f"config-{shape}.json"),
                                                                use_diff=True)


if __name__ == "__main__":
    main()
