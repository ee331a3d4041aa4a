#!/usr/bin/env python3
"""Fixtures for tests/test_gguf.c, written with gguf-py (pip install gguf numpy).

  python3 tests/data/gguf/make.py
      For every type engine/gguf.c decodes, <type>.gguf (random tensors of that type) and
      <type>.f32 (gguf-py's dequantization of its tensors, in file order, concatenated);
      meta.gguf holds one metadata entry of every value type, alignment 64.
      Deterministic (fixed seeds): running it again rewrites the same bytes.

  python3 tests/data/gguf/make.py reference MODEL.gguf OUT.bin
      For a real model (not committed): per tensor, a checksum of gguf-py's dequantization of all
      of it plus its first and last rows; per string array, a checksum of its strings. The C test
      compares with `tests/test_gguf --model MODEL.gguf OUT.bin`. Layout of OUT.bin (little-endian):
        u32 n_tensors, then per tensor: u32 name_len, name, u64 checksum, u64 ne0, u32 n_rows,
          n_rows x (u64 row, ne0 x f32)
        u32 n_arrays, then per string array: u32 key_len, key, u64 n, u64 fnv
      checksum = sum over the flattened float32 bits b[i] of b[i] * (2 i + 1), mod 2^64;
      fnv = FNV-1a 64 over every string as (u64 length, bytes).
"""
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

HERE = os.path.dirname(os.path.abspath(__file__))

# Scale fields (d, m, dmin): FP16 byte offsets within each block.
SCALE_AT = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
# Scales worth covering besides random ones: zeros, the smallest and largest subnormal, the
# smallest normal, the largest finite half.
SPECIAL_SCALES = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF], dtype=np.uint16)
# F16 values besides random ones: the above, infinities and quiet NaNs (a signalling NaN is left
# out: ggml returns it quiet, numpy keeps it signalling; test_gguf.c checks ours).
SPECIAL_F16 = np.concatenate([SPECIAL_SCALES, np.array([0x7C00, 0xFC00, 0x7E00, 0xFE01], dtype=np.uint16)])


def random_blocks(rng, qtype, n_blocks, specials):
    """Random block bytes whose FP16 scales are sane: mostly small random values, some special."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for at in SCALE_AT[qtype]:
        scales = (rng.standard_normal(n_blocks) * 0.02).astype(np.float16).view(np.uint16)
        if specials:
            k = min(n_blocks, len(SPECIAL_SCALES))
            scales[:k] = rng.permutation(SPECIAL_SCALES)[:k]
        blocks[:, at:at + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def tensors_for(rng, qtype):
    """(name, numpy array as GGUFWriter takes it, raw_dtype) for the fixture of one type.
    Shapes are numpy order: (..., ne1, ne0)."""
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return [("a", rng.standard_normal((3, 40)).astype(np.float32), None),
                ("b.weight", rng.standard_normal((2, 2, 8)).astype(np.float32), None),
                ("c", np.array([0.0, -0.0, 1e-45, -3.4e38, np.inf, -np.inf, np.nan, 1.5], dtype=np.float32), None)]
    if qtype == T.F16:
        bits = rng.integers(0, 0x7C00, size=120, dtype=np.uint16) | (rng.integers(0, 2, size=120, dtype=np.uint16) << 15)
        return [("a", bits.view(np.float16).reshape(3, 40), None),
                ("b.weight", rng.standard_normal((2, 2, 8)).astype(np.float16), None),
                ("c", SPECIAL_F16.view(np.float16), None)]
    if qtype == T.BF16:
        bits = rng.integers(0, 0x10000, size=120, dtype=np.uint16)   # every pattern: NaNs too
        return [("a", bits.view(np.uint8).reshape(3, 80), T.BF16),
                ("b.weight", quantize(rng.standard_normal((2, 2, 8)).astype(np.float32), T.BF16), T.BF16)]
    per_row = 4 if block == 32 else 2   # blocks per row of tensor a (4 rows)
    a = random_blocks(rng, qtype, 4 * per_row, True).reshape(4, -1)
    b = random_blocks(rng, qtype, 4, False).reshape(2, 2, -1)
    out = [("a", a, qtype), ("b.weight", b, qtype)]
    if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):   # gguf-py quantizes these
        out.append(("c", quantize(rng.standard_normal((1, 2 * block)).astype(np.float32), qtype), qtype))
    return out


def write_type_fixture(qtype, seed):
    rng = np.random.default_rng(seed)
    name = qtype.name.lower()
    path = os.path.join(HERE, name + ".gguf")
    w = gguf.GGUFWriter(path, arch="test")
    for tname, data, raw in tensors_for(rng, qtype):
        w.add_tensor(tname, data, raw_dtype=raw)
    write_all(w)
    reader = gguf.GGUFReader(path)
    ref = [dequantize(t.data, t.tensor_type).astype(np.float32).ravel() for t in reader.tensors]
    np.concatenate(ref).astype("<f4").tofile(os.path.join(HERE, name + ".f32"))


def write_meta_fixture():
    V = gguf.GGUFValueType
    w = gguf.GGUFWriter(os.path.join(HERE, "meta.gguf"), arch="llama")
    w.add_custom_alignment(64)
    w.add_key_value("t.u8", 200, V.UINT8)
    w.add_key_value("t.i8", -100, V.INT8)
    w.add_key_value("t.u16", 60000, V.UINT16)
    w.add_key_value("t.i16", -30000, V.INT16)
    w.add_key_value("t.u32", 4000000000, V.UINT32)
    w.add_key_value("t.i32", -2000000000, V.INT32)
    w.add_key_value("t.f32", 0.1, V.FLOAT32)
    w.add_key_value("t.bool", True, V.BOOL)
    w.add_key_value("t.str", "h\u00e9llo", V.STRING)
    w.add_key_value("t.u64", 2**63 + 5, V.UINT64)
    w.add_key_value("t.i64", -(2**40), V.INT64)
    w.add_key_value("t.f64", 0.1, V.FLOAT64)
    w.add_key_value("t.empty_str", "", V.STRING)
    w.add_key_value("t.strs", ["a", "", "\u0120the", "x" * 300], V.ARRAY, sub_type=V.STRING)
    w.add_key_value("t.i32s", [1, -2, 3], V.ARRAY, sub_type=V.INT32)
    w.add_key_value("t.f32s", [0.5, -1.25], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("t.bools", [True, False], V.ARRAY, sub_type=V.BOOL)
    w.add_tensor("w", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("v", np.arange(3, dtype=np.float32))
    write_all(w)


def write_all(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ----------------------------------------------------------------------------------------------
# Reference for a real model


def checksum(flat_bits):
    """sum of b[i] * (2 i + 1) mod 2^64, in chunks (numpy's uint64 arithmetic wraps)."""
    total = 0
    step = 1 << 22
    for lo in range(0, flat_bits.size, step):
        b = flat_bits[lo:lo + step].astype(np.uint64)
        i = np.arange(lo, lo + b.size, dtype=np.uint64)
        total = (total + int(np.sum(b * (np.uint64(2) * i + np.uint64(1)), dtype=np.uint64))) % 2**64
    return total


def fnv_strings(strings):
    h = 14695981039346656037
    for s in strings:
        for byte in struct.pack("<Q", len(s)) + s:
            h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def reference(model, out):
    r = gguf.GGUFReader(model)
    with open(out, "wb") as f:
        f.write(struct.pack("<I", len(r.tensors)))
        for t in r.tensors:
            x = dequantize(t.data, t.tensor_type).astype(np.float32)
            ne0 = int(t.shape[0])
            rows = x.reshape(-1, ne0)
            picks = sorted({0, rows.shape[0] - 1})
            name = t.name.encode()
            f.write(struct.pack("<I", len(name)) + name)
            f.write(struct.pack("<QQI", checksum(x.ravel().view(np.uint32)), ne0, len(picks)))
            for p in picks:
                f.write(struct.pack("<Q", p) + rows[p].astype("<f4").tobytes())
        arrays = [(k, fld) for k, fld in r.fields.items()
                  if fld.types[:2] == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING]]
        f.write(struct.pack("<I", len(arrays)))
        for k, fld in arrays:
            strings = [bytes(fld.parts[i]) for i in fld.data]
            key = k.encode()
            f.write(struct.pack("<I", len(key)) + key + struct.pack("<QQ", len(strings), fnv_strings(strings)))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "reference":
        reference(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) != 1:
        sys.exit("usage: make.py | make.py reference MODEL.gguf OUT.bin")
    for seed, qtype in enumerate([T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                                  T.Q4_K, T.Q5_K, T.Q6_K]):
        write_type_fixture(qtype, seed)
    write_meta_fixture()


if __name__ == "__main__":
    main()
