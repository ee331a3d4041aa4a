#!/bin/sh
# End-to-end decode benchmark on a machine with a GPU: synthetic checkpoints with real shapes (random
# weights), batch 1, greedy, one run per row. Bytes per token = weights (and scales) as the path
# holds them + the KV cache the decode steps actually read (mean over the steps); effective GB/s =
# that x tokens/s, against the H200's 4480 GB/s.
#   sh bench/bench.sh            all rows       BENCH_QUICK=1: the 7B paths and small models only
#   BENCH_NO_FP32=1: without the FP32 7B row (its 26 GB checkpoint takes minutes to write)
set -eu
cd "$(dirname "$0")/.."
out=${BENCH_DIR:-bench/out}
mkdir -p "$out"
make -s run quantize tokenizer.bin
. bench/lib.sh   # synth, prompt_of
rows="$out/rows.txt"; : > "$rows"
row() {   # label, model, positions (-n), prompt, extra flags
    ./run "$2" -z tokenizer.bin -p "$4" -n "$3" -t 0 $5 > /dev/null 2> "$out/run.err" || { cat "$out/run.err"; exit 1; }
    grep -q "device gpu" "$out/run.err" || { echo "bench: not on the GPU:"; cat "$out/run.err"; exit 1; }
    label=$1
    case " $5 " in *" --cluster-step "*)   # (it falls back with a message where it cannot run: no row then)
        grep -q "decode cluster step" "$out/run.err" || { echo "bench: $1: the cluster step did not run:"; cat "$out/run.err"; return 0; } ;;
    esac
    if [ -z "$5" ]; then   # the default: which step kernel ran (the cluster step first where both are there)
        if grep -q "decode cluster step" "$out/run.err"; then label="$label (cluster step)"
        elif grep -q "decode megakernel" "$out/run.err"; then label="$label (megakernel)"; fi
    fi
    awk -v label="$label" '/decode/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) == "tok/s;" && $(i-1) == "decode") tps = $i
            if ($(i-1) == "weights") w = $i
            if ($(i-1) == "cache") kv = $i
            if ($i == "prompt") p = $(i+1)
            if ($i == "generated") gen = $(i+1)
        }
        sub(/;/, "", gen)
        printf "%s|%d|%d|%.2f|%.4f|%.4f\n", label, p, gen, tps, w, kv
    }' "$out/run.err" | tee -a "$rows" | awk -F'|' '{ gb = $5 + $6
        printf "%-46s %6d %6d %9.1f %8.3f %7.3f %7.3f %8.0f %6.1f%%\n", $1, $2, $3, $4, 1000 / $4, $5, $6, gb * $4, gb * $4 / 44.80 }'
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version --format=csv
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)')"
printf "%-46s %6s %6s %9s %8s %7s %7s %8s %7s\n" "model, path" "prompt" "gen" "tok/s" "ms/tok" "GB w" "GB kv" "GB/s" "of 4480"
p5="Once upon a time"
q8=$(synth llama2-7b)
row "7b int8 fused (FP16 KV)" "$q8" 261 "$p5" ""
row "7b int8 fused, a kernel per matrix" "$q8" 261 "$p5" "--no-megakernel"
row "7b int8 fused, a kernel per matrix, no PDL" "$q8" 261 "$p5" "--no-megakernel --no-pdl"
row "7b int8 fused, register-fed GEMV, no PDL" "$q8" 261 "$p5" "--no-megakernel --no-tma-gemv --no-pdl"
row "7b int8 fused, no CUDA graph" "$q8" 261 "$p5" "--no-graph"
row "7b int8 fused, FP32 KV cache" "$q8" 261 "$p5" "--kv-fp32"
row "7b int8 --unfused (dequant + cuBLAS)" "$q8" 261 "$p5" "--unfused"
row "7b --fp16 (cuBLAS, converted at load)" "$q8" 261 "$p5" "--fp16"
if [ -z "${BENCH_QUICK:-}" ]; then
    [ -n "${BENCH_NO_FP32:-}" ] || row "7b fp32 cuBLAS" "$(synth llama2-7b --fp32)" 261 "$p5" ""
    for ctx in 128 1024 4096; do
        p=$p5; [ $ctx -gt 128 ] && p=$(prompt_of $((ctx - 200)))
        row "7b int8 fused, context $ctx" "$q8" $ctx "$p" ""
        [ $ctx -eq 4096 ] && row "7b int8 fused, context $ctx, a kernel per matrix" "$q8" $ctx "$p" "--no-megakernel"
        [ $ctx -eq 4096 ] && row "7b int8 fused, context $ctx, FP32 KV" "$q8" $ctx "$p" "--kv-fp32"
    done
fi
row "tinyllama-1.1b int8 fused" "$(synth tinyllama-1.1b)" 261 "$p5" ""
row "tinyllama-1.1b int8 fused, a kernel per matrix" "$(synth tinyllama-1.1b)" 261 "$p5" "--no-megakernel"
row "stories110m int8 fused" "$(synth stories110m)" 261 "$p5" ""
row "stories110m int8 fused, a kernel per matrix" "$(synth stories110m)" 261 "$p5" "--no-megakernel"
# the small shapes' steps on each of their paths: the default, and each named
row "stories15m int8 fused" "$(synth stories15m)" 256 "$p5" ""
row "stories15m int8 fused, a kernel per matrix" "$(synth stories15m)" 256 "$p5" "--no-cluster-step --no-megakernel"
row "stories15m int8 fused, a kernel per matrix, no CUDA graph" "$(synth stories15m)" 256 "$p5" "--no-cluster-step --no-megakernel --no-graph"
row "stories15m int8 --megakernel" "$(synth stories15m)" 256 "$p5" "--no-cluster-step --megakernel"
row "stories15m int8 --cluster-step" "$(synth stories15m)" 256 "$p5" "--cluster-step"
# Hugging Face shapes (vocabularies 49152 and 128256, beyond tokenizer.bin's 32000)
row "smollm2-135m int8 fused" "$(synth smollm2-135m)" 256 "$p5" ""
row "smollm2-135m int8 --unfused (dequant + cuBLAS)" "$(synth smollm2-135m)" 256 "$p5" "--unfused"
row "smollm2-135m int8 fused, a kernel per matrix" "$(synth smollm2-135m)" 256 "$p5" "--no-cluster-step --no-megakernel"
row "smollm2-135m int8 --megakernel" "$(synth smollm2-135m)" 256 "$p5" "--no-cluster-step --megakernel"
row "smollm2-135m int8 --cluster-step" "$(synth smollm2-135m)" 256 "$p5" "--cluster-step"
if [ -z "${BENCH_QUICK:-}" ]; then
    row "llama3-8b int8 fused" "$(synth llama3-8b)" 261 "$p5" ""
    row "llama3-8b int8 fused, a kernel per matrix" "$(synth llama3-8b)" 261 "$p5" "--no-megakernel"
fi
if [ -f models/stories260K.bin ]; then
    [ -f "$out/stories260K.q8.bin" ] || ./quantize models/stories260K.bin "$out/stories260K.q8.bin" > /dev/null
    for flags in "" "--no-cluster-step"; do
        ./run "$out/stories260K.q8.bin" -z models/tok512.bin -n 512 -t 0 $flags > /dev/null 2> "$out/run.err"
        awk -v flags="$flags" '/decode/ { for (i = 1; i <= NF; i++) if ($(i+1) == "tok/s;" && $(i-1) == "decode") print "stories260K int8 fused, " (flags ? flags : "the default") " (real model, 512 positions): " $i " tok/s decode" }' "$out/run.err"
    done
fi
# prefill: a 512-token prompt in one chunk (tensor cores: wgmma) against decoding one token per forward
p512=$(prompt_of 512)
./run "$q8" -z tokenizer.bin -p "$p512" -n 600 -t 0 > /dev/null 2> "$out/run.err" || { cat "$out/run.err"; exit 1; }
awk '/decode/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "tok/s," && $(i-1) == "prefill") p = $i; if ($(i+1) == "tok/s;" && $(i-1) == "decode") d = $i; if ($i == "prompt") n = $(i+1) }
    printf "7b prefill of %d tokens: %.1f tok/s; decode (one token per forward) %.1f tok/s: %.1fx\n", n, p, d, p / d }' "$out/run.err"
# batched decode: B sequences together, aggregate and per-sequence tokens/s (bench/out/batch.csv);
# greedy (the argmax on the GPU).
echo "B,aggregate,per_sequence" > "$out/batch.csv"
for B in 1 2 4 8 16 32 64; do
    ./run "$q8" -z tokenizer.bin -p "$p5" -n 133 -t 0 -s 1 --batch $B > /dev/null 2> "$out/run.err" || { cat "$out/run.err"; exit 1; }
    if [ $B -eq 1 ]; then awk '/decode/ { for (i = 1; i <= NF; i++) if ($(i+1) == "tok/s;" && $(i-1) == "decode") print "1," $i "," $i }' "$out/run.err"
    else awk -v B=$B '/^batch/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "tok/s" && $(i+2) == "aggregate,") a = $i; if ($(i+1) == "tok/s" && $(i+2) == "per") p = $i }
        print B "," a "," p }' "$out/run.err"; fi
done | tee -a "$out/batch.csv" | awk -F, '{ printf "7b --batch %-3s %9.1f tok/s aggregate, %8.1f per sequence\n", $1, $2, $3 }'
# sampled (-t 0.8, top-p 0.9): the tokens drawn on the GPU (one int a sequence to the host), and
# with --host-sample on the host (the 32000 logits of each sequence to it a step)
sampled() {   # label, extra flags
    ./run "$q8" -z tokenizer.bin -p "$p5" -n 133 -t 0.8 -s 1 $2 > /dev/null 2> "$out/run.err" || { cat "$out/run.err"; exit 1; }
    awk -v label="$1" '/decode/ || /^batch/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "tok/s;" && $(i-1) == "decode") d = $i; if ($(i+1) == "tok/s" && $(i+2) == "aggregate,") a = $i } }
        END { printf "7b sampled (-t 0.8, top-p 0.9), %s: %.1f tok/s%s\n", label, a ? a : d, a ? " aggregate" : "" }' "$out/run.err"
}
sampled "batch 1, on the GPU" ""
sampled "batch 1, on the host" "--host-sample"
sampled "--batch 16, on the GPU" "--batch 16"
sampled "--batch 16, on the host" "--batch 16 --host-sample"
# speedups of the default fused path over the baselines, same run
awk -F'|' '{ t[$1] = $4; if (index($1, "7b int8 fused (FP16 KV)") == 1) f = $4 } END {   # (the default row: its label names its step kernel)
    printf "7b speedup of fused: %.2fx over --unfused, %.2fx over --fp16 cuBLAS", f / t["7b int8 --unfused (dequant + cuBLAS)"], f / t["7b --fp16 (cuBLAS, converted at load)"]
    if (t["7b fp32 cuBLAS"]) printf ", %.2fx over fp32 cuBLAS", f / t["7b fp32 cuBLAS"]
    printf "\n" }' "$rows"
