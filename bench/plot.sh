#!/bin/sh
# PNG charts of bench/kernel_bench --across-m's CSV (gnuplot, from Debian's gnuplot-nox):
#   bench/out/across_m_gbs.png     effective GB/s against M, per path, one panel per shape, with
#                                  the H200's 4480 GB/s read bandwidth drawn
#   bench/out/across_m_tflops.png  TFLOP/s against M, with the dense FP16 tensor-core peak drawn
# Usage: sh bench/plot.sh [csv] (default bench/out/across_m.csv)
set -eu
cd "$(dirname "$0")/.."
csv=${1:-bench/out/across_m.csv}
out=$(dirname "$csv")
command -v gnuplot > /dev/null || { echo "plot.sh: gnuplot not found (apt-get install gnuplot-nox)"; exit 1; }
shapes=$(awk -F, 'NR > 1 { print $1 }' "$csv" | awk '!seen[$0]++')
paths=$(awk -F, 'NR > 1 { print $3 }' "$csv" | awk '!seen[$0]++')
# one data file per shape and path: M, us, TFLOP/s, GB/s
for s in $shapes; do for p in $paths; do
    awk -F, -v s="$s" -v p="$p" '$1 == s && $3 == p { print $2, $4, $5, $6 }' "$csv" > "$out/plot_${s}_$p.dat"
done; done
plot() {   # column, ylabel, png, reference value, reference label, key position
    {
        echo "set terminal pngcairo size 1500,450 font ',10'; set output '$3'"
        echo "set multiplot layout 1,$(echo $shapes | wc -w)"
        echo "set logscale xy 2; set xlabel 'M (tokens)'; set ylabel '$2'; set key $6 font ',8'; set grid; set style data linespoints"
        for s in $shapes; do
            echo "set title 'W $s (N x K), INT8 group size 128'"
            printf "plot %s title '%s' with lines dt 2 lc 'black'" "$4" "$5"
            for p in $paths; do
                [ "$1" = 3 ] && [ "$p" = deq ] && continue   # the dequant kernel alone does no FLOPs
                printf ", '%s' using 1:%s with linespoints title '%s'" "$out/plot_${s}_$p.dat" "$1" "$p"
            done
            echo
        done
        echo "unset multiplot"
    } | gnuplot
}
plot 4 "effective GB/s" "$out/across_m_gbs.png" 4480 "4480 GB/s (H200 read)" "bottom left"
plot 3 "TFLOP/s" "$out/across_m_tflops.png" 989 "989 TFLOP/s (dense FP16 tensor peak)" "top left"
rm -f "$out"/plot_*.dat
echo "plot.sh: wrote $out/across_m_gbs.png and $out/across_m_tflops.png"
# tokens/s against the batch size (bench/bench.sh's batch.csv), if it is there
if [ -f "$out/batch.csv" ]; then
    tail -n +2 "$out/batch.csv" | tr , ' ' > "$out/plot_batch.dat"
    gnuplot <<PLOT
set terminal pngcairo size 800,450 font ',10'; set output '$out/batch_tokens.png'
set logscale xy 2; set xlabel 'sequences decoded together (--batch)'; set ylabel 'tokens/s'; set grid; set key top left
set title 'llama2-7b shape, INT8 fused, decode'
plot '$out/plot_batch.dat' using 1:2 with linespoints title 'aggregate', '' using 1:3 with linespoints title 'per sequence'
PLOT
    rm -f "$out/plot_batch.dat"
    echo "plot.sh: wrote $out/batch_tokens.png"
fi
