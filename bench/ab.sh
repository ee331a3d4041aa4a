#!/bin/sh
# A/B of two builds of run on a machine with a GPU, row by row in one run: each row runs A, then B,
# then A and B again, on the same synthetic checkpoints (made as bench/bench.sh makes them), and
# prints both decode rates, and whether the greedy texts of A and B are identical.
# Usage: sh bench/ab.sh A B     (A, B: paths of run binaries; QUANTIZE: the quantize to use)
set -eu
cd "$(dirname "$0")/.."
A=$1 B=$2
out=${BENCH_DIR:-bench/out}
mkdir -p "$out"
. bench/lib.sh   # synth, prompt_of, rate
one() {   # binary, tag, model, -n, prompt, flags
    $1 "$3" -z tokenizer.bin -p "$5" -n "$4" $6 > "$out/ab_$2.txt" 2> "$out/ab_$2.err" || { cat "$out/ab_$2.err"; exit 1; }
    grep -q "device gpu" "$out/ab_$2.err" || { echo "ab: not on the GPU:"; cat "$out/ab_$2.err"; exit 1; }
    rate "$out/ab_$2.err"
}
row() {   # label, model, -n, prompt, flags
    a1=$(one "$A" a "$2" "$3" "$4" "$5"); b1=$(one "$B" b "$2" "$3" "$4" "$5")
    same=$(cmp -s "$out/ab_a.txt" "$out/ab_b.txt" && echo same || echo DIFFERENT)
    a2=$(one "$A" a "$2" "$3" "$4" "$5"); b2=$(one "$B" b "$2" "$3" "$4" "$5")
    cmp -s "$out/ab_a.txt" "$out/ab_b.txt" || same=DIFFERENT
    printf "%-44s %9s %9s | %9s %9s | text %s\n" "$1" "$a1" "$a2" "$b1" "$b2" "$same"
}
echo "A = $A, B = $B"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
printf "%-44s %19s | %19s | %s\n" "row (decode tok/s; --batch: aggregate)" "A, A again" "B, B again" "A's stdout == B's"
p5="Once upon a time"
q8=$(synth llama2-7b)
row "7b int8 fused (defaults)" "$q8" 261 "$p5" "-t 0"
row "7b int8 fused, --no-pdl" "$q8" 261 "$p5" "-t 0 --no-pdl"
row "7b int8 fused, --no-tma-gemv --no-pdl" "$q8" 261 "$p5" "-t 0 --no-tma-gemv --no-pdl"
row "7b int8 fused, --no-graph" "$q8" 261 "$p5" "-t 0 --no-graph"
row "7b int8 fused, --kv-fp32" "$q8" 261 "$p5" "-t 0 --kv-fp32"
row "7b int8 --unfused" "$q8" 261 "$p5" "-t 0 --unfused"
row "7b --fp16" "$q8" 261 "$p5" "-t 0 --fp16"
row "7b int8 fused, context 1024" "$q8" 1024 "$(prompt_of 824)" "-t 0"
row "7b int8 fused, context 4096" "$q8" 4096 "$(prompt_of 3896)" "-t 0"
row "7b prefill of 450 tokens (decode rate)" "$q8" 600 "$(prompt_of 512)" "-t 0"
row "7b --batch 16 greedy" "$q8" 133 "$p5" "-t 0 -s 1 --batch 16"
row "7b sampled -t 0.8" "$q8" 133 "$p5" "-t 0.8 -s 1"
row "7b sampled --batch 16" "$q8" 133 "$p5" "-t 0.8 -s 1 --batch 16"
row "tinyllama-1.1b int8 fused" "$(synth tinyllama-1.1b)" 261 "$p5" "-t 0"
row "stories110m int8 fused" "$(synth stories110m)" 261 "$p5" "-t 0"
row "stories15m int8 fused" "$(synth stories15m)" 256 "$p5" "-t 0"
row "stories15m int8 fused, --no-graph" "$(synth stories15m)" 256 "$p5" "-t 0 --no-graph"
