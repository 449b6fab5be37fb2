#!/usr/bin/env python3
"""Writes byte-exact dequantization vectors for the formats checked against gguf-py
(testdata/reference/quant-vectors/w_<type>.bin + w_<type>_deq_f32.bin, listed in index.json).

Blocks are seeded random bytes with a finite f16 scale (zero, subnormal, negative and large
ones included); gguf-py's numpy `gguf.quants.dequantize` (PyPI gguf==0.19.0, independent of
our Rust code) gives the floats. `cargo test -p quant` asserts bit equality.

    pip install gguf==0.19.0 && python3 scripts/make-quant-vectors.py
"""
import json
import os
from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "reference", "quant-vectors")
N_BLOCKS = 8
SEED = 36

# name -> (type, bytes per block, byte offsets of f16 scales; None: IQ1_M's split scale)
TYPES = {
    "q2_K": (T.Q2_K, 84, [80, 82]),
    "q3_K": (T.Q3_K, 110, [108]),
    "iq4_xs": (T.IQ4_XS, 136, [0]),
    "iq3_s": (T.IQ3_S, 110, [0]),
    "iq2_xxs": (T.IQ2_XXS, 66, [0]),
    "iq2_xs": (T.IQ2_XS, 74, [0]),
    "iq2_s": (T.IQ2_S, 82, [0]),
    "iq1_s": (T.IQ1_S, 50, [0]),
    "iq1_m": (T.IQ1_M, 56, None),
}


def f16_bits(rng, i):
    """A finite f16 scale: block 0 zero, block 1 subnormal, block 2 large, others random."""
    if i == 0:
        return 0
    sign = int(rng.integers(0, 2)) << 15
    man = int(rng.integers(0, 1024))
    exp = {1: 0, 2: 25}.get(i, int(rng.integers(5, 20)))
    return sign | (exp << 10) | man


def make_blocks(rng, size, scales):
    blocks = rng.integers(0, 256, size=(N_BLOCKS, size), dtype=np.uint8)
    for i in range(N_BLOCKS):
        if scales is None:  # IQ1_M: nibble k of d is the top nibble of scale word k (bytes 48..56)
            d = f16_bits(rng, i)
            for k in range(4):
                hi = 48 + 2 * k + 1
                blocks[i, hi] = (blocks[i, hi] & 0x0F) | (((d >> (4 * k)) & 0xF) << 4)
        else:
            for off in scales:
                blocks[i, off:off + 2] = np.frombuffer(np.uint16(f16_bits(rng, i)).tobytes(), np.uint8)
    return blocks


def main():
    rng = np.random.default_rng(SEED)
    idx_path = os.path.join(DIR, "index.json")
    index = json.load(open(idx_path))
    src = f"gguf-py {version('gguf')} gguf.quants.dequantize, scripts/make-quant-vectors.py (seed {SEED})"
    index["source_gguf_py"] = src
    for name, (qt, size, scales) in TYPES.items():
        assert quants.GGML_QUANT_SIZES[qt] == (256, size), name
        blocks = make_blocks(rng, size, scales)
        deq = quants.dequantize(blocks.reshape(-1), qt).astype(np.float32)
        assert deq.shape == (N_BLOCKS * 256,) and np.isfinite(deq).all(), name
        blocks.tofile(os.path.join(DIR, f"w_{name}.bin"))
        deq.astype("<f4").tofile(os.path.join(DIR, f"w_{name}_deq_f32.bin"))
        index["files"][f"w_{name}.bin"] = f"{N_BLOCKS} random {name} blocks of {size} bytes (gguf-py vectors)"
        index["files"][f"w_{name}_deq_f32.bin"] = f"gguf-py dequantize(w_{name}) as float32 [{N_BLOCKS * 256}]"
    with open(idx_path, "w") as f:
        json.dump(index, f, indent=1)
    print("wrote", len(TYPES), "types to", DIR)


if __name__ == "__main__":
    main()
