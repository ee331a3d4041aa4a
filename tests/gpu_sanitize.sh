#!/bin/sh
# compute-sanitizer over the GPU tests (tests/test_run_gpu --gpu-only --quick: every kernel and
# both executors on random models, stories260K and the split-attention model; not the 7B-shaped
# one, which takes too long instrumented) and over a short greedy generation on each GPU path:
# fused (graph and plain launches), --unfused, --fp16, FP32 cuBLAS, and a prompt prefilled on the
# tensor cores then decoded as --batch 4. Each of memcheck, racecheck,
# initcheck and synccheck must report nothing. Ends with "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.."
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
pass=0 fail=0
log=$(mktemp)
q8=models/stories260K_q8.bin f32=models/stories260K.bin T=models/tok512.bin
# TOOLS: a subset of the tools; SUITE=0: the generations only, not the GPU test suite
suite="tests/test_run_gpu --gpu-only --quick models"
[ "${SUITE:-1}" = 0 ] && suite=""
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
    for target in ${suite:+"$suite"} \
                  "./run $q8 -z $T -n 48 -t 0" "./run $q8 -z $T -n 48 -t 0 --no-graph --no-pdl" \
                  "./run $q8 -z $T -n 48 -t 0 --unfused" "./run $q8 -z $T -n 48 -t 0 --fp16" \
                  "./run $q8 -z $T -n 48 -t 0 --kv-fp32" "./run $f32 -z $T -n 48 -t 0" \
                  "./run $q8 -z $T -n 48 -t 0.8 -p Once.upon.a.time.there.was.a.little.girl --batch 4"; do
        $CS --tool $tool --error-exitcode 9 $target > "$log" 2>&1
        rc=$?
        if [ $rc -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards" "$log"; then
            echo "PASS $tool: $target"; pass=$((pass + 1))
        else
            echo "FAIL $tool: $target (exit $rc)"; grep -E "=========" "$log" | head -12; fail=$((fail + 1))
        fi
    done
done
rm -f "$log"
echo "$pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
