#!/usr/bin/env python3
"""Writes engine/unicode_tables.h: the Unicode data the BPE pre-tokenizers and the NFC normalizer
need, as sorted C arrays the engine binary-searches.

    pip install unicodedata2==16.0.0     # Unicode 16.0, what tokenizers 0.23's Oniguruma uses
    python3 tests/data/bpe/make_unicode_tables.py [--check]

Why Unicode 16.0 and these sets: Hugging Face tokenizers runs its Split regexes with Oniguruma,
whose \\p{L}, \\p{N} are the Unicode 16.0 general categories L* and N* and whose \\s is the
White_Space property (not Python's str.isspace, which adds U+001C..U+001F). Its Digits
pre-tokenizer instead uses Rust's char::is_numeric, which in the Rust that built tokenizers 0.23.3
is already Unicode 17: N* of 16.0 plus the 13 code points in RUST_NUMERIC_17. --check compares
every table with the installed tokenizers over all of Unicode (a minute) and fails on a difference.

NFC is older: tokenizers normalizes with unicode-normalization-alignments 0.1.12, a 2019 fork whose
tables are Unicode 9.0. Its NFC data is Unicode 16's less what came after 9.0 (combining classes
and decompositions are stable once assigned): NFC_AFTER_9, the code points whose combining class
or decomposition Unicode 16 has and 9.0 (Python 3.6's unicodedata) has not. --check tests it.

NFC data: canonical combining classes, canonical decompositions (one level, as UnicodeData.txt
gives them; the engine recurses) and the primary composites (pairs that NFC recomposes: a
canonical pair decomposition that is not a composition exclusion). Hangul is algorithmic in C.
"""
import sys

try:
    import unicodedata2 as ud
except ImportError:
    sys.exit("make_unicode_tables.py: needs unicodedata2==16.0.0 (pip install unicodedata2==16.0.0)")

UNICODE_VERSION = "16.0.0"
# PropList.txt White_Space (unchanged since Unicode 6.3, when U+180E left it)
WHITE_SPACE = [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680] + list(range(0x2000, 0x200B)) + \
              [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
# Numbers new in Unicode 17 (Tolong Siki digits; U+16FF4..16FF6), which Rust's is_numeric knows
RUST_NUMERIC_17 = list(range(0x11DE0, 0x11DEA)) + [0x16FF4, 0x16FF5, 0x16FF6]
# Rust regex's \w (added tokens' single_word): Alphabetic, M*, Nd, Pc, Join_Control. Alphabetic is
# L*, Nl and Other_Alphabetic, which is marks but for these So letters (PropList.txt)
OTHER_ALPHABETIC_SO = list(range(0x24B6, 0x24EA)) + list(range(0x1F130, 0x1F14A)) + \
                      list(range(0x1F150, 0x1F16A)) + list(range(0x1F170, 0x1F18A))
JOIN_CONTROL = [0x200C, 0x200D]
# Code points with NFC data (a combining class, a canonical decomposition) new after Unicode 9.0:
# compared with Python 3.6's unicodedata (9.0.0) once, kept here so that the script needs only
# unicodedata2 16.0.0. tokenizers' NFC knows none of them (--check).
NFC_AFTER_9 = [
    (0x7FD, 0x7FD), (0x897, 0x89F), (0x8CA, 0x8D3), (0x9FE, 0x9FE), (0xC3C, 0xC3C), (0xD3B, 0xD3C),
    (0xEBA, 0xEBA), (0x1715, 0x1715), (0x1ABF, 0x1ACE), (0x1DF6, 0x1DFA), (0xA82C, 0xA82C),
    (0x105C9, 0x105C9), (0x105E4, 0x105E4), (0x10D24, 0x10D27), (0x10D69, 0x10D6D), (0x10EAB,
    0x10EAC), (0x10EFD, 0x10EFF), (0x10F46, 0x10F50), (0x10F82, 0x10F85), (0x11070, 0x11070),
    (0x1133B, 0x1133B), (0x11383, 0x11383), (0x11385, 0x11385), (0x1138E, 0x1138E), (0x11391,
    0x11391), (0x113C5, 0x113C5), (0x113C7, 0x113C8), (0x113CE, 0x113D0), (0x1145E, 0x1145E),
    (0x11839, 0x1183A), (0x11938, 0x11938), (0x1193D, 0x1193E), (0x11943, 0x11943), (0x119E0,
    0x119E0), (0x11A34, 0x11A34), (0x11A47, 0x11A47), (0x11A99, 0x11A99), (0x11D42, 0x11D42),
    (0x11D44, 0x11D45), (0x11D97, 0x11D97), (0x11F41, 0x11F42), (0x16121, 0x16128), (0x1612F,
    0x1612F), (0x16D68, 0x16D6A), (0x16FF0, 0x16FF1), (0x1E08F, 0x1E08F), (0x1E130, 0x1E136),
    (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF), (0x1E4EC, 0x1E4EF), (0x1E5EE, 0x1E5EF)
]
OUT = "engine/unicode_tables.h"


def all_code_points():
    return [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]


def ranges(cps):
    out = []
    for c in sorted(cps):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def category_set(prefix):
    return {c for c in all_code_points() if ud.category(chr(c))[0] == prefix}


def word_set():
    cats = ("Nd", "Nl", "Pc")
    return {c for c in all_code_points() if ud.category(chr(c))[0] in "LM" or ud.category(chr(c)) in cats} | \
        set(OTHER_ALPHABETIC_SO) | set(JOIN_CONTROL)


def after_9():
    return {c for lo, hi in NFC_AFTER_9 for c in range(lo, hi + 1)}


def ccc_ranges():
    out, newer = [], after_9()
    for c in all_code_points():
        k = ud.combining(chr(c)) if c not in newer else 0
        if not k:
            continue
        if out and out[-1][1] == c - 1 and out[-1][2] == k:
            out[-1][1] = c
        else:
            out.append([c, c, k])
    return out


def decompositions():
    out, newer = [], after_9()
    for c in all_code_points():
        d = ud.decomposition(chr(c)) if c not in newer else ""
        if d and not d.startswith("<"):
            parts = [int(x, 16) for x in d.split()]
            assert len(parts) in (1, 2), hex(c)
            out.append((c, parts[0], parts[1] if len(parts) == 2 else 0))
    return out


def compositions(decomps):
    # a pair decomposition is a primary composite exactly when NFC puts it back together
    return sorted((a, b, c) for c, a, b in decomps if b and ud.normalize("NFC", chr(a) + chr(b)) == chr(c))


def c_rows(rows, per_line, fmt):
    lines = []
    for i in range(0, len(rows), per_line):
        lines.append("    " + " ".join(fmt(r) for r in rows[i:i + per_line]))
    return "\n".join(lines)


def write(path):
    letters, numbers = ranges(category_set("L")), ranges(category_set("N"))
    numeric = ranges(category_set("N") | set(RUST_NUMERIC_17))
    word = ranges(word_set())
    ccc, decomps = ccc_ranges(), decompositions()
    comps = compositions(decomps)
    pair = lambda r: "{0x%X, 0x%X}," % (r[0], r[1])
    triple = lambda r: "{0x%X, 0x%X, 0x%X}," % tuple(r)
    parts = [
        "// unicode_tables.h: generated by tests/data/bpe/make_unicode_tables.py from Unicode %s" % UNICODE_VERSION,
        "// (unicodedata2 %s); the NFC tables as Unicode 9.0 had them (NFC_AFTER_9 left out). Do not" % ud.unidata_version,
        "// edit; run the script. Sorted, for binary search.",
        "#ifndef UNICODE_TABLES_H",
        "#define UNICODE_TABLES_H",
        "",
        "#include <stdint.h>",
        "",
        "typedef struct { uint32_t lo, hi; } UniRange;",
        "typedef struct { uint32_t lo, hi, ccc; } UniCccRange;",
        "typedef struct { uint32_t cp, a, b; } UniDecomp;   // cp -> a b (b = 0: a singleton)",
        "typedef struct { uint32_t a, b, cp; } UniComp;     // a b -> cp, sorted by (a, b)",
        "",
        "#define UNI_VERSION \"%s\"" % UNICODE_VERSION,
        "",
        "// General category L* (Oniguruma's \\p{L})",
        "static const UniRange uni_letter[%d] = {\n%s\n};" % (len(letters), c_rows(letters, 5, pair)),
        "// General category N* (Oniguruma's \\p{N})",
        "static const UniRange uni_number[%d] = {\n%s\n};" % (len(numbers), c_rows(numbers, 5, pair)),
        "// Rust's char::is_numeric as tokenizers 0.23.3 was built: N* plus Unicode 17's new numbers",
        "static const UniRange uni_rust_numeric[%d] = {\n%s\n};" % (len(numeric), c_rows(numeric, 5, pair)),
        "// White_Space (Oniguruma's \\s, Rust's char::is_whitespace)",
        "static const UniRange uni_space[%d] = {\n%s\n};" % (len(ranges(WHITE_SPACE)), c_rows(ranges(WHITE_SPACE), 5, pair)),
        "// Rust regex's \\w: Alphabetic, marks, Nd, Pc, Join_Control",
        "static const UniRange uni_word[%d] = {\n%s\n};" % (len(word), c_rows(word, 5, pair)),
        "// Canonical combining class, where not 0",
        "static const UniCccRange uni_ccc[%d] = {\n%s\n};" % (len(ccc), c_rows(ccc, 4, triple)),
        "// Canonical decompositions, one level",
        "static const UniDecomp uni_decomp[%d] = {\n%s\n};" % (len(decomps), c_rows(decomps, 4, triple)),
        "// Primary composites",
        "static const UniComp uni_comp[%d] = {\n%s\n};" % (len(comps), c_rows(comps, 4, triple)),
        "",
        "#endif",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(parts))
    print("%s: %d letter, %d number, %d ccc ranges, %d decompositions, %d compositions"
          % (path, len(letters), len(numbers), len(ccc), len(decomps), len(comps)))


def matched_by(pre_tokenizer, text, cps):
    # the code points a "removed" split deletes are the ones its pattern matches
    kept = set()
    for _, (a, b) in pre_tokenizer.pre_tokenize_str(text):
        kept.update(range(a, b))
    return {cps[i] for i in range(len(cps)) if i not in kept}


def check_nfc(nfc, cps):
    """Unicode 9.0's NFC: single code points as Unicode 16's (but for what came after 9.0, which
    stays as it is), every mark's class by reordering it against U+0345 (class 240), and every
    primary composite by composing its pair."""
    newer = after_9()
    bad = [c for c in cps if nfc.normalize_str(chr(c)) != (chr(c) if c in newer else ud.normalize("NFC", chr(c)))]
    print("NFC of single code points: %d differ" % len(bad))
    ccc = {c: k for lo, hi, k in ccc_ranges() for c in range(lo, hi + 1)}
    marks = [c for c in cps if 0 < ud.combining(chr(c)) < 240 and ud.decomposition(chr(c)) == ""]
    moved = [c for c in marks if nfc.normalize_str("\u0915\u0345" + chr(c)) == "\u0915" + chr(c) + "\u0345"]
    print("NFC reordering: %d marks move, %d in the table" % (len(moved), len([c for c in marks if c in ccc])))
    comps = compositions(decompositions())
    uncomposed = [c for a, b, c in comps if nfc.normalize_str(chr(a) + chr(b)) != chr(c)]
    print("NFC composition: %d of %d pairs do not compose" % (len(uncomposed), len(comps)))
    return bool(bad) or set(moved) != {c for c in marks if c in ccc} or bool(uncomposed)


def check_word(cps):
    """\\w as tokenizers' single_word sees it: "X" after a word character is not the added token."""
    from tokenizers import AddedToken, Tokenizer, models
    t = Tokenizer(models.BPE())
    t.add_tokens([AddedToken("X", single_word=True)])
    x = t.token_to_id("X")
    got = {c for c, e in zip(cps, t.encode_batch([chr(c) + "X" for c in cps])) if x not in e.ids}
    want = word_set()
    print("\\w: %d code points, %d differ" % (len(got), len(got ^ want)))
    return got != want


def check():
    from tokenizers import Regex, pre_tokenizers, normalizers
    cps = all_code_points()
    text = "".join(chr(c) for c in cps)
    failed = 0
    for name, pattern, want in [("\\p{L}", r"\p{L}", category_set("L")), ("\\p{N}", r"\p{N}", category_set("N")),
                                ("\\s", r"\s", set(WHITE_SPACE))]:
        got = matched_by(pre_tokenizers.Split(Regex(pattern), "removed"), text, cps)
        print("%s: %d code points, %d differ" % (name, len(got), len(got ^ want)))
        failed |= got != want
    spaced = "a".join(chr(c) for c in cps)   # letters between keep each digit its own piece
    digits = {cps[a // 2] for _, (a, b) in pre_tokenizers.Digits(individual_digits=True).pre_tokenize_str(spaced)
              if b - a == 1 and a % 2 == 0}
    want = category_set("N") | set(RUST_NUMERIC_17)
    print("Digits: %d code points, %d differ" % (len(digits), len(digits ^ want)))
    failed |= digits != want
    failed |= check_nfc(normalizers.NFC(), cps)
    failed |= check_word(cps)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    assert ud.unidata_version == UNICODE_VERSION, "unicodedata2 is Unicode %s, want %s" % (ud.unidata_version, UNICODE_VERSION)
    if "--check" in sys.argv:
        check()
    else:
        write(OUT)
