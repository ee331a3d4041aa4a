#!/usr/bin/env python3
# make.py: writes the safetensors fixtures of tests/test_json.c with the reference writer
# (safetensors.torch.save_file). Half-precision tensors hold random bit patterns (every class:
# normals, subnormals, zeros, infinities, NaNs) and special values; beside each, "<name>.as_f32"
# holds PyTorch's own conversion to float32, which the C reader must reproduce bit for bit.
#   single/model.safetensors: one file of every kind the test reads
#   sharded/: model.safetensors.index.json and two shards, expectations in the other shard
#   (fuzz/ is not made here: seeds and a kept crash for tests/fuzz/safetensors_target.c, whose
#   first byte picks the mode: even, one file; odd, an index and two shards)
# Usage: python3 tests/data/safetensors/make.py  (needs torch, safetensors, numpy)
import json
import os

import numpy as np
import torch
from safetensors.torch import save_file

here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng()

F16_SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF]
BF16_SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF]


def half_bits(special, n, dtype):
    bits = np.concatenate([np.array(special, dtype=np.uint16), rng.integers(0, 1 << 16, n, dtype=np.uint16)])
    return torch.from_numpy(bits.astype(np.int16)).view(dtype)


def with_expectation(tensors, name, t):
    tensors[name] = t
    tensors[name + ".as_f32"] = t.float()


def single():
    t = {}
    with_expectation(t, "f16", half_bits(F16_SPECIAL, 50, torch.float16).reshape(8, 8))
    with_expectation(t, "bf16", half_bits(BF16_SPECIAL, 50, torch.bfloat16).reshape(4, 2, 8))
    t["f32"] = torch.from_numpy(rng.standard_normal((3, 5), dtype=np.float32))
    t["i64"] = torch.from_numpy(rng.integers(-(1 << 62), 1 << 62, 3))
    t["scalar"] = torch.tensor(float(rng.standard_normal()), dtype=torch.float32)
    t["empty"] = torch.zeros((0, 3), dtype=torch.float16)
    os.makedirs(os.path.join(here, "single"), exist_ok=True)
    save_file(t, os.path.join(here, "single", "model.safetensors"), metadata={"format": "pt", "note": "test fixture"})


def sharded():
    emb = torch.from_numpy(rng.standard_normal((6, 4), dtype=np.float32)).to(torch.float16)
    w0 = torch.from_numpy(rng.standard_normal((8, 4), dtype=np.float32)).to(torch.bfloat16)
    shards = [
        {"model.embed_tokens.weight": emb, "model.layers.0.mlp.up_proj.weight": w0},
        {"model.layers.1.mlp.up_proj.weight": torch.from_numpy(rng.standard_normal((8, 4), dtype=np.float32)),
         "model.norm.weight": torch.from_numpy(rng.standard_normal(4, dtype=np.float32)),
         "expect.model.embed_tokens.weight": emb.float(), "expect.model.layers.0.mlp.up_proj.weight": w0.float()},
    ]
    d = os.path.join(here, "sharded")
    os.makedirs(d, exist_ok=True)
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        save_file(tensors, os.path.join(d, name), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)


single()
sharded()
