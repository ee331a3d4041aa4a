#!/bin/sh
# Nsight Compute on one fused and one unfused layer of a 7B shape (default 4096 x 11008, the w2
# layer), on the GPU machine: DRAM bytes read and written and DRAM throughput for each kernel, so
# the traffic fusion saves is measured, not asserted; then the fused kernel's issue and stall
# profile. Usage: bench/ncu.sh [N K]
set -eu
cd "$(dirname "$0")/.."
N=${1:-4096} K=${2:-11008}
make -s bench/kernel_bench
NCU=${NCU:-ncu}
metrics=dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
echo "== DRAM traffic per kernel ($N x $K, M = 1): fused q8_matmul vs unfused dequant + cuBLAS gemv"
$NCU --clock-control none --kernel-name regex:'q8_matmul|dequant|gemv|gemm' --metrics $metrics \
    ./bench/kernel_bench --profile "$N" "$K" 2>&1 | grep -E 'q8_matmul|dequant|gemv|gemm|dram__|gpu__time|profiled' | sed -E 's/\(int, int, int\)//'
echo "== fused kernel: speed of light, occupancy, issue and warp stalls"
$NCU --clock-control none --kernel-name regex:q8_matmul --section SpeedOfLight --section Occupancy \
    --section SchedulerStats --section WarpStateStats \
    ./bench/kernel_bench --profile "$N" "$K" 2>&1 | grep -E '^\s+(DRAM|Memory|Compute|Duration|Achieved|Theoretical|One or More|No Eligible|Issued Warp|Active Warps|Eligible Warps|Warp Cycles|Avg. Active|Registers|Block Limit)' || true
