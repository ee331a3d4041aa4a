#!/bin/sh
# CPU benchmark: code15M (14.5M parameters, dim 288, 6 layers, vocab 32000) on the CPU executor,
# greedy, 256 positions; each row runs REPEAT times (default 5) and reports the median and the
# range. Beside it, other engines on the same model and threads: measured in this run where they
# are given, a run of theirs beside each of ours, with the median of the rounds' ratios (the
# machine's speed varies from one series of runs to the next, so only figures of one run
# compare):
#   LLAMA2C=path    llama2.c's run.c built with `gcc -Ofast -fopenmp -march=native run.c -lm`;
#                   its "achieved tok/s" over 256 steps of code15M.bin (FP32)
#   LLAMA_BENCH=path and LLAMA_GGUF=prefix   llama.cpp's llama-bench, on PREFIX.q8_0.gguf and
#                   PREFIX.f16.gguf made from code15M.bin (bench/llama2c_to_gguf.py, then
#                   llama-quantize): `-p 0 -n 128 -t T` (decode) and `-p 256 -n 0 -t T` (prefill),
#                   Q8_0 one repetition a round (`-r 1`), F16 its mean over its 5 repetitions
# Otherwise the anchors recorded on the 2-core development machine (AMD EPYC, AVX-512) are
# printed, with their date (bench/NOTES.md 43 says how they were measured).
#   sh bench/cpu.sh     (make bench-cpu)   THREADS=n: threads (default: all), REPEAT=n
set -eu
cd "$(dirname "$0")/.."
# the other engines' paths, where given, must be there
[ -z "${LLAMA2C:-}" ] || [ -x "$LLAMA2C" ] || { echo "bench/cpu.sh: LLAMA2C=$LLAMA2C is not an executable file" >&2; exit 1; }
if [ -n "${LLAMA_BENCH:-}${LLAMA_GGUF:-}" ]; then
    [ -x "${LLAMA_BENCH:-}" ] || { echo "bench/cpu.sh: LLAMA_BENCH=${LLAMA_BENCH:-} is not an executable file" >&2; exit 1; }
    for t in q8_0 f16; do
        [ -f "${LLAMA_GGUF:-}.$t.gguf" ] || { echo "bench/cpu.sh: LLAMA_GGUF=${LLAMA_GGUF:-}: ${LLAMA_GGUF:-}.$t.gguf is missing" >&2; exit 1; }
    done
fi
out=${BENCH_DIR:-bench/out}
mkdir -p "$out"
make -s run quantize tokenizer.bin models/code15M.bin
model=models/code15M.bin
for gs in 64 128; do
    [ -f "$out/code15M_q$gs.bin" ] || ./quantize "$model" "$out/code15M_q$gs.bin" -g $gs > /dev/null
done
threads=${THREADS:-0}
targs=""; [ "$threads" -gt 0 ] && targs="--threads $threads"
# A prompt of 254 tokens of code15M's kind of text (then two positions are generated).
prompt=$(cat tests/data/code.txt tests/data/story.txt | head -c 900)

# median and range of field $2 ("decode" or "prefill") over REPEAT runs of: run <model> <args>.
# With OTHER set (a command printing one tok/s figure, OTHER_NAME its engine), one run of it
# beside each of ours, after ours and before it in turn, and its median and the median (and
# range) of the rounds' ratios, ours over its, follow ours: on this kind of shared host a series
# of runs of one engine and then a series of the other's compare the host's two states as much
# as the engines, and the run first in a round tends to be faster (bench/NOTES.md 68).
measure() {
    what=$1; shift
    i=0
    : > "$out/cpu_runs.txt"
    : > "$out/cpu_other.txt"
    while [ $i -lt "${REPEAT:-5}" ]; do
        if [ -n "${OTHER:-}" ] && [ $((i % 2)) = 1 ]; then eval "$OTHER" >> "$out/cpu_other.txt"; fi
        ./run "$@" --device cpu $targs -t 0 > /dev/null 2> "$out/cpu_run.err" || { cat "$out/cpu_run.err"; exit 1; }
        awk -v what="$what" '{ for (i = 1; i < NF; i++) if ($i == what && $(i+2) ~ /^tok\/s/) print $(i+1) }' "$out/cpu_run.err" >> "$out/cpu_runs.txt"
        if [ -n "${OTHER:-}" ] && [ $((i % 2)) = 0 ]; then eval "$OTHER" >> "$out/cpu_other.txt"; fi
        i=$((i + 1))
    done
    sort -n "$out/cpu_runs.txt" | awk '{ v[NR] = $1 } END { printf "%9.1f  (%.1f - %.1f)", v[int((NR + 1) / 2)], v[1], v[NR] }'
    [ -n "${OTHER:-}" ] || return 0
    sort -n "$out/cpu_other.txt" | awk -v name="$OTHER_NAME" '{ v[NR] = $1 } END { printf "   %s, alternating: %.1f", name, v[int((NR + 1) / 2)] }'
    paste "$out/cpu_runs.txt" "$out/cpu_other.txt" | awk '$2 > 0 { print $1 / $2 }' | sort -n |
        awk '{ v[NR] = $1 } END { if (NR) printf ", ours / its %.2f (%.2f - %.2f)", v[int((NR + 1) / 2)], v[1], v[NR] }'
}
row() {   # label, anchor text, what, run arguments...
    label=$1 anchor=$2; shift 2
    printf "%-40s %s   %s\n" "$label" "$(measure "$@")" "$anchor"
}
# A row whose runs alternate with another engine's (its name, a command for one run of it; more
# anchor text after it), where that engine is given, else a row with its recorded anchor.
row_alternating() {   # label, other's name, its one-run command or "", recorded anchor, more text, what, run arguments...
    label=$1 name=$2 cmd=$3 anchor=$4 more=$5; shift 5
    if [ -z "$cmd" ]; then row "$label" "$anchor$more" "$@"; return; fi
    printf "%-40s %s%s\n" "$label" "$(OTHER=$cmd OTHER_NAME=$name measure "$@")" "$more"
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//') $(nproc) cores;" \
     "vector extensions: $(grep -m1 -o -w -E 'avx512f|avx512_vnni|avx2|fma|asimd|sve' /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ')"
./run "$out/code15M_q64.bin" -n 2 -t 0 --device cpu $targs 2>&1 >/dev/null | grep -o 'device cpu.*' | head -1
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)'), repeats ${REPEAT:-5}"
nt=${THREADS:-$(nproc)}
# One run of llama2.c (its "achieved tok/s"), and llama-bench's figure (type, its arguments)
one_llama2c() {
    OMP_NUM_THREADS=$nt "$LLAMA2C" "$model" -n 256 -t 0 -z tokenizer.bin 2>&1 | awk '/achieved tok\/s/ { print $NF }'
}
one_llamacpp() {
    t=$1; shift
    "$LLAMA_BENCH" -m "$LLAMA_GGUF.$t.gguf" "$@" -t "$nt" -o csv 2>/dev/null | tail -1 | awk -F, '{ gsub(/"/, ""); print $(NF - 1) }'
}
[ -n "${LLAMA2C:-}" ] && l2c=one_llama2c || l2c=
[ -n "${LLAMA_BENCH:-}" ] && lcpp="one_llamacpp q8_0 -r 1" || lcpp=
# llama-bench's mean for one type and test, or the recorded anchor
llamacpp() {   # type, anchor, llama-bench arguments
    t=$1 anchor=$2; shift 2
    [ -n "${LLAMA_BENCH:-}" ] || { echo "llama.cpp $t (2026-12-01): $anchor"; return; }
    printf "llama.cpp %s, this run: %.1f" "$t" "$(one_llamacpp "$t" "$@")"
}
# the ceiling: the model file read by nt threads (an FP32 decode step reads about all of it)
[ -x bench/cpu_read ] && bench/cpu_read "$model" "$nt" 20 | awk -v bytes="$(wc -c < "$model")" '{ print "memory: " $0
    for (i = 1; i < NF; i++) if ($i == "median") g = $(i + 1) }
    END { printf "memory: FP32 decode at that rate reads the file %.0f times a second (%.1f MB each)\n", g * 1e9 / bytes, bytes / 1e6 }'
printf "%-40s %9s  %s   %s\n" "code15M, 256 positions" "tok/s" "(min - max)" "other engines"
row_alternating "decode, FP32" llama2.c "$l2c" "llama2.c (2026-12-01): 532-586" "" decode "$model" -n 256
row_alternating "decode, INT8 GS 64" "llama.cpp q8_0" "${lcpp:+$lcpp -p 0 -n 128}" "llama.cpp q8_0 (2026-12-01): 1088" \
    "; $(llamacpp f16 391 -p 0 -n 128)" decode "$out/code15M_q64.bin" -n 256
row "decode, INT8 GS 128" "" decode "$out/code15M_q128.bin" -n 256
row "prefill of 254 tokens, FP32" "" prefill "$model" -n 256 -p "$prompt"
row_alternating "prefill of 254 tokens, INT8 GS 64" "llama.cpp q8_0" "${lcpp:+$lcpp -p 256 -n 0}" "llama.cpp q8_0 (2026-12-01): 9757" "" \
    prefill "$out/code15M_q64.bin" -n 256 -p "$prompt"
row "prefill, INT8 GS 64, --int8-prefill" "" prefill "$out/code15M_q64.bin" -n 256 -p "$prompt" --int8-prefill
row "prefill, INT8 GS 128, --int8-prefill" "" prefill "$out/code15M_q128.bin" -n 256 -p "$prompt" --int8-prefill
