#!/bin/sh
# CPU benchmark: code15M (14.5M parameters, dim 288, 6 layers, vocab 32000) on the CPU executor,
# greedy, 256 positions; each row runs REPEAT times (default 5) and reports the median and the
# range. Beside it, the anchors: other engines measured on the 2-core development machine (AMD
# EPYC, AVX-512), same shape, 2 threads:
#   llama.cpp b10573 built from source (AVX2 build), random weights of code15M's shape,
#     `llama-bench -p 0 -n 128 -t 2` (decode) and `-p 256 -n 0 -t 2` (prefill): Q8_0 683 tok/s
#     decode and 6,402 tok/s prefill of 256 tokens; F16 411 tok/s decode
#   llama2.c run.c built with `-Ofast -fopenmp -march=native`, OMP_NUM_THREADS=2, its "achieved
#     tok/s" over 256 steps of code15M.bin: 227-230 (FP32)
# Those figures are from that machine only; on another machine they are not comparable.
#   sh bench/cpu.sh     (make bench-cpu)   THREADS=n: threads (default: all), REPEAT=n
set -eu
cd "$(dirname "$0")/.."
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

# median and range of field $2 ("decode" or "prefill") over REPEAT runs of: run <model> <args>
measure() {
    what=$1; shift
    i=0
    : > "$out/cpu_runs.txt"
    while [ $i -lt "${REPEAT:-5}" ]; do
        ./run "$@" --device cpu $targs -t 0 > /dev/null 2> "$out/cpu_run.err" || { cat "$out/cpu_run.err"; exit 1; }
        awk -v what="$what" '{ for (i = 1; i < NF; i++) if ($i == what && $(i+2) ~ /^tok\/s/) print $(i+1) }' "$out/cpu_run.err" >> "$out/cpu_runs.txt"
        i=$((i + 1))
    done
    sort -n "$out/cpu_runs.txt" | awk '{ v[NR] = $1 } END { printf "%9.1f  (%.1f - %.1f)", v[int((NR + 1) / 2)], v[1], v[NR] }'
}
row() {   # label, anchor text, what, run arguments...
    label=$1 anchor=$2; shift 2
    printf "%-40s %s   %s\n" "$label" "$(measure "$@")" "$anchor"
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//') $(nproc) cores;" \
     "vector extensions: $(grep -m1 -o -w -E 'avx512f|avx512_vnni|avx2|fma|asimd|sve' /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ')"
./run "$out/code15M_q64.bin" -n 2 -t 0 --device cpu $targs 2>&1 >/dev/null | grep -o 'device cpu.*' | head -1
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)'), repeats ${REPEAT:-5}"
printf "%-40s %9s  %s   %s\n" "code15M, 256 positions" "tok/s" "(min - max)" "anchor on the 2-core machine"
row "decode, FP32" "llama2.c -Ofast -fopenmp: 227-230" decode "$model" -n 256
row "decode, INT8 GS 64" "llama.cpp Q8_0: 683; F16: 411" decode "$out/code15M_q64.bin" -n 256
row "decode, INT8 GS 128" "" decode "$out/code15M_q128.bin" -n 256
row "prefill of 254 tokens, FP32" "" prefill "$model" -n 256 -p "$prompt"
row "prefill of 254 tokens, INT8 GS 64" "llama.cpp Q8_0: 6,402" prefill "$out/code15M_q64.bin" -n 256 -p "$prompt"
