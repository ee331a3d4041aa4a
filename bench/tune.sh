#!/bin/sh
# Build-time tuning of the GEMVs' constants (cuda/gemv.cuh: Q8_TMA_STAGES, Q8_TMA_BLOCKS,
# Q8_PREFETCH_BYTES; bench/NOTES.md 22, 32): builds run once per variant, each into
# bench/out/tune/<n>/run, then decodes a synthetic checkpoint with every variant in turn, twice.
# Usage (GPU machine): sh bench/tune.sh "-DQ8_TMA_STAGES=2 -DQ8_TMA_BLOCKS=4" "-DQ8_TMA_STAGES=4 -DQ8_TMA_BLOCKS=2"
# MODEL (default llama2-7b: a preset of quantize --synthetic), FLAGS (run's, default "-t 0").
set -eu
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: sh bench/tune.sh \"-DQ8_...=v ...\" ..." >&2; exit 2; }
make -s quantize tokenizer.bin
out=bench/out/tune
mkdir -p "$out"
n=0
for defs in "$@"; do
    n=$((n + 1))
    make -s tune-variant TUNE_DIR="$out/$n" TUNE_DEFS="$defs"
done
model=bench/out/${MODEL:-llama2-7b}.bin
[ -f "$model" ] || ./quantize --synthetic "${MODEL:-llama2-7b}" "$model" 2> /dev/null
for pass in 1 2; do
    n=0
    for defs in "$@"; do
        n=$((n + 1))
        "$out/$n/run" "$model" -z tokenizer.bin -p "Once upon a time" -n 261 ${FLAGS:--t 0} > /dev/null 2> "$out/run.err"
        awk -v defs="$defs" -v pass=$pass '/decode/ { for (i = 1; i <= NF; i++) if ($(i+1) == "tok/s;" && $(i-1) == "decode") printf "pass %d  %-50s %9.1f tok/s\n", pass, defs, $i }' "$out/run.err"
    done
done
