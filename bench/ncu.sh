#!/bin/sh
# Nsight Compute on one fused and one unfused layer of a 7B shape (default 4096 x 11008, the w2
# layer), on a machine with a GPU: DRAM bytes read and written and DRAM throughput for each kernel, so
# the traffic fusion saves is measured, not asserted; then the fused kernel's issue and stall
# profile. Usage: bench/ncu.sh [N K]
#   bench/ncu.sh step [MODEL]: one launch of a decode step's kernel (KERNEL, a regex, default the
#   cluster step's layers kernel; MODEL a quantize --synthetic preset, default stories15m), the
#   120th of a 200-token greedy run without the graph: its issue rate, the warps' stall samples by
#   reason and by instruction, and its instruction mix (the source page, SASS; the out-of-line code
#   after the last EXIT, the waits' retry loops and slow paths, counted apart); then the same by
#   source line (bench/ncu_lines.awk over nvdisasm -g of kernels.o's cubin, where the toolkit has
#   cuobjdump and nvdisasm). The report and its CSV stay in bench/out as ncu_step_MODEL_KERNEL.
set -eu
cd "$(dirname "$0")/.."
NCU=${NCU:-ncu}
if [ "${1:-}" = step ]; then
    make -s run quantize tokenizer.bin
    out=bench/out; mkdir -p $out
    . bench/lib.sh   # synth
    kernel=${KERNEL:-cs_layers_kernel} model=${2:-stories15m}
    rep=$out/ncu_step_${model}_$(echo "$kernel" | tr -c 'A-Za-z0-9_.\n-' _)
    $NCU -f -o $rep --set full --kernel-name "regex:$kernel" --launch-skip 120 --launch-count 1 \
        ./run "$(synth "$model")" -z tokenizer.bin -p "Once upon a time" -n 200 -t 0 --no-graph > $rep.log 2>&1 ||
        { tail -5 $rep.log; exit 1; }
    $NCU -i $rep.ncu-rep --page details --print-details all | grep -E '^ +(Duration|SM Frequency|Registers Per Thread|Active Warps Per Scheduler|Issued Warp Per Scheduler|No Eligible) ' | sort -u
    $NCU -i $rep.ncu-rep --page source --csv --print-source sass > $rep.csv
    awk -F'","' -f bench/ncu_csv.awk -f bench/ncu_source.awk $rep.csv $rep.csv
    bin=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")
    if [ -x "$bin/cuobjdump" ] && [ -x "$bin/nvdisasm" ]; then
        rm -rf $out/cubin && mkdir -p $out/cubin
        (cd $out/cubin && "$bin/cuobjdump" -xelf all ../../../kernels.o > /dev/null)
        "$bin/nvdisasm" -g -c $out/cubin/*sm_90a*.cubin > $out/kernels.sass
        awk -F'","' -f bench/ncu_csv.awk -f bench/ncu_lines.awk $out/kernels.sass $rep.csv
    else
        echo "by source line: no cuobjdump and nvdisasm beside nvcc; elsewhere: awk -F'\",\"' -f bench/ncu_csv.awk -f bench/ncu_lines.awk LISTING $rep.csv (LISTING: nvdisasm -g -c of this build's sm_90a cubin)"
    fi
    exit 0
fi
N=${1:-4096} K=${2:-11008}
make -s bench/kernel_bench
metrics=dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
echo "== DRAM traffic per kernel ($N x $K, M = 1): fused q8_matmul vs unfused dequant + cuBLAS gemv"
$NCU --clock-control none --kernel-name regex:'q8_matmul|dequant|gemv|gemm' --metrics $metrics \
    ./bench/kernel_bench --profile "$N" "$K" 2>&1 | grep -E 'q8_matmul|dequant|gemv|gemm|dram__|gpu__time|profiled' | sed -E 's/\(int, int, int\)//'
echo "== fused kernel: speed of light, occupancy, issue and warp stalls"
$NCU --clock-control none --kernel-name regex:q8_matmul --section SpeedOfLight --section Occupancy \
    --section SchedulerStats --section WarpStateStats \
    ./bench/kernel_bench --profile "$N" "$K" 2>&1 | grep -E '^\s+(DRAM|Memory|Compute|Duration|Achieved|Theoretical|One or More|No Eligible|Issued Warp|Active Warps|Eligible Warps|Warp Cycles|Avg. Active|Registers|Block Limit)' || true
