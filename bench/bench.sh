#!/bin/sh
# End-to-end decode benchmark on the GPU machine: synthetic Llama-2-7B-shaped checkpoints (random
# weights), batch 1, a short prompt then 256 new tokens, greedy; one run per path.
# Prints decode tokens/s, ms/token, weight bytes/token and effective bandwidth against 4480 GB/s.
set -eu
cd "$(dirname "$0")/.."
out=${BENCH_DIR:-bench/out}
mkdir -p "$out"
make -s run quantize tokenizer.bin
[ -f "$out/llama2-7b.q8.bin" ] || ./quantize --synthetic llama2-7b "$out/llama2-7b.q8.bin"
[ -f "$out/llama2-7b.f32.bin" ] || ./quantize --synthetic llama2-7b --fp32 "$out/llama2-7b.f32.bin"
prompt="Once upon a time"
steps=$((256 + 5))   # 5 prompt tokens (BOS included) + 256 new
row() {   # label, model, extra flags
    ./run "$2" -z tokenizer.bin -p "$prompt" -n $steps -t 0 $3 > /dev/null 2> "$out/run.err" || { cat "$out/run.err"; exit 1; }
    grep -q "device gpu" "$out/run.err" || { echo "bench: not on the GPU:"; cat "$out/run.err"; exit 1; }
    awk -v label="$1" '/decode/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) == "tok/s;" && $(i-1) == "decode") tps = $i
            if ($(i+1) == "GB/token,") gb = $i
            if ($i == "generated") gen = $(i+1)
        }
        sub(/;/, "", gen)
        printf "%-36s %6s %10.1f %9.3f %8.3f %9.0f %6.1f%%\n", label, gen, tps, 1000 / tps, gb, gb * tps, gb * tps / 4480 * 100
    }' "$out/run.err"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
printf "%-36s %6s %10s %9s %8s %9s %7s\n" "path (llama2-7b shape)" "tokens" "tok/s" "ms/tok" "GB/tok" "GB/s" "of 4480"
row "int8 fused (default)" "$out/llama2-7b.q8.bin" "" | tee "$out/fused.row"
row "int8 --unfused (dequant + cuBLAS)" "$out/llama2-7b.q8.bin" "--unfused" | tee "$out/unfused.row"
row "fp32 cuBLAS" "$out/llama2-7b.f32.bin" "" | tee "$out/fp32.row"
awk 'FNR == 1 { t[FILENAME] = $(NF-4) } END {
    for (f in t) if (f ~ /fused.row$/ && f !~ /unfused/) fu = t[f]; else if (f ~ /unfused/) un = t[f]; else fp = t[f]
    printf "fused / unfused: %.2fx   fused / fp32 cuBLAS: %.2fx\n", fu / un, fu / fp }' "$out/fused.row" "$out/unfused.row" "$out/fp32.row"
