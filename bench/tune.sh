#!/bin/sh
# Build-time tuning and A/B of the kernels' constants and options (cuda/gemv.cuh's Q8_TMA_STAGES,
# Q8_TMA_BLOCKS, Q8_PREFETCH_BYTES; cuda/megakernel.cuh's MK_...; bench/NOTES.md 22, 32, 72):
# builds run once per variant, side by side, each into bench/out/tune/<n>/run, then decodes
# synthetic checkpoints with every variant in turn, row by row, each row PASSES times, and says
# where a variant's greedy text differs from the first variant's.
# Usage (a machine with a GPU):
#   sh bench/tune.sh "" "-DMK_IN_FLIGHT=2" "-DQ8_TMA_STAGES=2 -DQ8_TMA_BLOCKS=4"     ("": as it is)
# ROWS (default 7b): any of 7b, 7b-4096 (a prompt of about 3,400 tokens decoded to 4096),
# tinyllama, stories15m, smollm2; PASSES (default 2); FLAGS (run's, default "-t 0"); RUN_TIMEOUT
# (seconds a run may take, default 120).
set -eu
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: sh bench/tune.sh \"-D...=v ...\" ..." >&2; exit 2; }
make -s quantize tokenizer.bin tune-objects
out=bench/out tune=bench/out/tune   # the checkpoints (as bench.sh makes them); the builds and runs
mkdir -p "$tune"
. bench/lib.sh   # synth, prompt_of, rate
n=0 pids=
for defs in "$@"; do   # (TUNE_BUILT=1: the caller has built them, bench/cluster_ab.sh)
    n=$((n + 1))
    [ "${TUNE_BUILT:-}" = 1 ] && continue
    make -s tune-variant TUNE_DIR="$tune/$n" TUNE_DEFS="$defs" > "$tune/$n.log" 2>&1 &
    pids="$pids $!"
done
n=0
for pid in $pids; do
    n=$((n + 1))
    wait "$pid" || { echo "tune: variant $n failed to build:"; cat "$tune/$n.log"; exit 1; }
done
row() {   # label, model, positions (-n), prompt
    pass=0
    while [ $pass -lt "${PASSES:-2}" ]; do
        pass=$((pass + 1)) n=0 line=
        for v in $variants; do
            n=$((n + 1))
            # (a variant that hangs fails here, rather than holding the run until the machine's own limit)
            timeout "${RUN_TIMEOUT:-120}" "$tune/$n/run" "$2" -z tokenizer.bin -p "$4" -n "$3" ${FLAGS:--t 0} > "$tune/$n.txt" 2> "$tune/run.err" ||
                { echo "tune: variant $n failed (status $?):"; cat "$tune/run.err"; exit 1; }
            same=; [ $n -gt 1 ] && ! cmp -s "$tune/1.txt" "$tune/$n.txt" && same=" (text differs)"
            line="$line | $n: $(rate "$tune/run.err")$same"
        done
        printf "pass %d %-11s%s\n" $pass "$1" "$line"
    done
}
variants=$(seq $#)
n=0
for defs in "$@"; do n=$((n + 1)); echo "variant $n: ${defs:-(as it is)}"; done
! command -v nvidia-smi > /dev/null || nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
p5="Once upon a time"
for r in ${ROWS:-7b}; do
    case $r in
    7b) row 7b "$(synth llama2-7b)" 261 "$p5" ;;
    7b-4096) row 7b-4096 "$(synth llama2-7b)" 4096 "$(prompt_of 3896)" ;;
    tinyllama) row tinyllama "$(synth tinyllama-1.1b)" 261 "$p5" ;;
    stories15m) row stories15m "$(synth stories15m)" 256 "$p5" ;;
    smollm2) row smollm2 "$(synth smollm2-135m)" 256 "$p5" ;;
    *) echo "tune: unknown row $r (7b, 7b-4096, tinyllama, stories15m, smollm2)" >&2; exit 2 ;;
    esac
done
