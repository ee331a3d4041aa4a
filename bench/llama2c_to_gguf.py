#!/usr/bin/env python3
"""A llama2.c checkpoint (legacy v0 format) and its tokenizer.bin as an F32 GGUF file, for
measuring llama.cpp on the same model as this engine (bench/cpu.sh's anchors):

    pip install gguf numpy
    python3 bench/llama2c_to_gguf.py models/code15M.bin tokenizer.bin /tmp/code15M.f32.gguf
    llama-quantize /tmp/code15M.f32.gguf /tmp/code15M.q8_0.gguf Q8_0
    llama-bench -m /tmp/code15M.q8_0.gguf -p 0 -n 128 -t 2      # decode
    llama-bench -m /tmp/code15M.q8_0.gguf -p 256 -n 0 -t 2      # prefill of 256 tokens

llama2.c's RoPE turns adjacent pairs (2i, 2i + 1), as llama.cpp's "llama" architecture does, so
wq and wk are written as they are (no row permutation). The vocabulary is Llama 2's, rebuilt from
tokenizer.bin: llama2.c's export wrote the pieces with " " for the SentencePiece space and <s>,
</s> as "\\n<s>\\n", "\\n</s>\\n"; both are undone.
"""
import os
import struct
import sys

import gguf
import numpy as np


def fail(msg):
    sys.exit("llama2c_to_gguf.py: " + msg)


def read_file(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        fail(f"{path}: {e.strerror}")


def read_checkpoint(path):
    data = read_file(path)
    if len(data) < 28:
        fail(f"{path}: shorter than a llama2.c header (28 bytes)")
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack_from("<7i", data, 0)
    if min(dim, hidden, layers, heads, kv_heads, seq_len) <= 0 or vocab == 0 or dim % heads or heads % kv_heads \
            or (dim // heads) % 2 or max(dim, hidden, abs(vocab), seq_len) > 1 << 20 or layers > 1024:
        fail(f"{path}: header (dim {dim}, hidden {hidden}, layers {layers}, heads {heads}, kv heads {kv_heads}, "
             f"vocab {vocab}, seq_len {seq_len}) is not a llama2.c legacy checkpoint's")
    shared = vocab > 0
    vocab = abs(vocab)
    head = dim // heads
    kv_dim = kv_heads * head
    at = 28
    need = (vocab * dim + layers * (2 * dim + 2 * dim * dim + 2 * kv_dim * dim + 3 * hidden * dim) + dim
            + seq_len * head + (0 if shared else vocab * dim)) * 4 + at
    if len(data) != need:
        fail(f"{path}: {len(data)} bytes where its header implies {need}")
    f = np.frombuffer(data, dtype="<f4", offset=at)
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        out = f[pos:pos + n].reshape(shape)
        pos += n
        return out

    w = {"emb": take(vocab, dim), "rms_att": take(layers, dim), "wq": take(layers, dim, dim),
         "wk": take(layers, kv_dim, dim), "wv": take(layers, kv_dim, dim), "wo": take(layers, dim, dim),
         "rms_ffn": take(layers, dim), "w1": take(layers, hidden, dim), "w2": take(layers, dim, hidden),
         "w3": take(layers, hidden, dim), "rms_final": take(dim)}
    take(seq_len, head // 2)   # freq_cis_real
    take(seq_len, head // 2)   # freq_cis_imag
    w["cls"] = w["emb"] if shared else take(vocab, dim)
    cfg = dict(dim=dim, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, vocab=vocab, seq_len=seq_len)
    return cfg, w, shared


def read_tokenizer(path, vocab):
    data = read_file(path)
    at = 4
    tokens, scores, types = [], [], []
    for i in range(vocab):
        if at + 8 > len(data):
            fail(f"{path}: ends at token {i} of the model's {vocab}")
        score, n = struct.unpack_from("<fi", data, at)
        if n < 0 or at + 8 + n > len(data):
            fail(f"{path}: token {i}'s length {n} runs past the end of the file")
        try:
            piece = data[at + 8:at + 8 + n].decode("utf-8")
        except UnicodeDecodeError:
            fail(f"{path}: token {i} is not UTF-8")
        at += 8 + n
        if i == 1:
            piece = "<s>"
        elif i == 2:
            piece = "</s>"
        t = gguf.TokenType.NORMAL
        if i == 0:
            t = gguf.TokenType.UNKNOWN
        elif i in (1, 2):
            t = gguf.TokenType.CONTROL
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            t = gguf.TokenType.BYTE
        else:
            piece = piece.replace(" ", "\u2581")
        tokens.append(piece.encode("utf-8"))
        scores.append(score)
        types.append(t)
    return tokens, scores, types


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: llama2c_to_gguf.py checkpoint.bin tokenizer.bin out.gguf")
    out = sys.argv[3]
    for src in sys.argv[1:3]:
        if os.path.exists(out) and os.path.exists(src) and os.path.samefile(out, src):
            fail(f"{out}: the output is the input {src}")
    if os.path.exists(out) and not os.path.isfile(out):
        fail(f"{out}: not a regular file")
    cfg, w, shared = read_checkpoint(sys.argv[1])
    tokens, scores, types = read_tokenizer(sys.argv[2], cfg["vocab"])
    g = gguf.GGUFWriter(out, "llama")
    g.add_name("llama2.c " + sys.argv[1])
    g.add_context_length(cfg["seq_len"])
    g.add_embedding_length(cfg["dim"])
    g.add_block_count(cfg["layers"])
    g.add_feed_forward_length(cfg["hidden"])
    g.add_rope_dimension_count(cfg["dim"] // cfg["heads"])
    g.add_head_count(cfg["heads"])
    g.add_head_count_kv(cfg["kv_heads"])
    g.add_layer_norm_rms_eps(1e-5)
    g.add_file_type(gguf.LlamaFileType.ALL_F32)
    g.add_tokenizer_model("llama")
    g.add_token_list(tokens)
    g.add_token_scores(scores)
    g.add_token_types(types)
    g.add_bos_token_id(1)
    g.add_eos_token_id(2)
    g.add_unk_token_id(0)
    g.add_tensor("token_embd.weight", np.ascontiguousarray(w["emb"]))
    for l in range(cfg["layers"]):
        b = f"blk.{l}."
        g.add_tensor(b + "attn_norm.weight", np.ascontiguousarray(w["rms_att"][l]))
        g.add_tensor(b + "attn_q.weight", np.ascontiguousarray(w["wq"][l]))
        g.add_tensor(b + "attn_k.weight", np.ascontiguousarray(w["wk"][l]))
        g.add_tensor(b + "attn_v.weight", np.ascontiguousarray(w["wv"][l]))
        g.add_tensor(b + "attn_output.weight", np.ascontiguousarray(w["wo"][l]))
        g.add_tensor(b + "ffn_norm.weight", np.ascontiguousarray(w["rms_ffn"][l]))
        g.add_tensor(b + "ffn_gate.weight", np.ascontiguousarray(w["w1"][l]))
        g.add_tensor(b + "ffn_down.weight", np.ascontiguousarray(w["w2"][l]))
        g.add_tensor(b + "ffn_up.weight", np.ascontiguousarray(w["w3"][l]))
    g.add_tensor("output_norm.weight", np.ascontiguousarray(w["rms_final"]))
    if not shared:
        g.add_tensor("output.weight", np.ascontiguousarray(w["cls"]))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


if __name__ == "__main__":
    main()
