#!/bin/sh
# End-to-end decode benchmark on the GPU machine: synthetic checkpoints with real shapes (random
# weights), batch 1, a short prompt then up to 256 new tokens, greedy; one run per row.
# Prints decode tokens/s, ms/token, weight bytes/token and effective bandwidth against 4480 GB/s.
set -eu
cd "$(dirname "$0")/.."
out=${BENCH_DIR:-bench/out}
mkdir -p "$out"
make -s run quantize tokenizer.bin
synth() {   # name [--fp32]
    f="$out/$1${2:+.f32}.bin"
    [ -f "$f" ] || ./quantize --synthetic "$1" ${2:-} "$f" 2>/dev/null
    echo "$f"
}
prompt="Once upon a time"
row() {   # label, model, steps, extra flags
    ./run "$2" -z tokenizer.bin -p "$prompt" -n "$3" -t 0 $4 > /dev/null 2> "$out/run.err" || { cat "$out/run.err"; exit 1; }
    grep -q "device gpu" "$out/run.err" || { echo "bench: not on the GPU:"; cat "$out/run.err"; exit 1; }
    awk -v label="$1" '/decode/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) == "tok/s;" && $(i-1) == "decode") tps = $i
            if ($(i+1) == "GB/token,") gb = $i
            if ($i == "generated") gen = $(i+1)
        }
        sub(/;/, "", gen)
        printf "%-44s %6s %10.1f %9.3f %8.3f %9.0f %6.1f%%\n", label, gen, tps, 1000 / tps, gb, gb * tps, gb * tps / 4480 * 100
    }' "$out/run.err"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
printf "%-44s %6s %10s %9s %8s %9s %7s\n" "model, path" "tokens" "tok/s" "ms/tok" "GB/tok" "GB/s" "of 4480"
q8=$(synth llama2-7b) f32=$(synth llama2-7b --fp32)
row "llama2-7b int8 fused (default)" "$q8" 261 "" | tee "$out/fused.row"
row "llama2-7b int8 fused, no CUDA graph" "$q8" 261 "--no-graph"
row "llama2-7b int8 --unfused (dequant + cuBLAS)" "$q8" 261 "--unfused" | tee "$out/unfused.row"
row "llama2-7b fp32 cuBLAS" "$f32" 261 "" | tee "$out/fp32.row"
awk 'FNR == 1 { t[FILENAME] = $(NF-4) } END {
    for (f in t) if (f ~ /\/fused.row$/) fu = t[f]; else if (f ~ /unfused/) un = t[f]; else fp = t[f]
    printf "llama2-7b: fused / unfused %.2fx, fused / fp32 cuBLAS %.2fx\n", fu / un, fu / fp }' "$out/fused.row" "$out/unfused.row" "$out/fp32.row"
row "tinyllama-1.1b int8 fused" "$(synth tinyllama-1.1b)" 261 ""
row "stories110m int8 fused" "$(synth stories110m)" 261 ""
row "stories15m int8 fused" "$(synth stories15m)" 256 ""
row "stories15m int8 fused, no CUDA graph" "$(synth stories15m)" 256 "--no-graph"
if [ -f models/stories260K.bin ]; then
    [ -f "$out/stories260K.q8.bin" ] || ./quantize models/stories260K.bin "$out/stories260K.q8.bin" > /dev/null
    ./run "$out/stories260K.q8.bin" -z models/tok512.bin -n 512 -t 0 > /dev/null 2> "$out/run.err"
    awk '/decode/ { for (i = 1; i <= NF; i++) if ($(i+1) == "tok/s;" && $(i-1) == "decode") print "stories260K int8 fused (real model): " $i " tok/s decode" }' "$out/run.err"
fi
