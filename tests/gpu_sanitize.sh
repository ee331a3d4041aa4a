#!/bin/sh
# compute-sanitizer over the GPU tests (tests/test_run_gpu --gpu-only --quick: every kernel and
# both executors on random models, stories260K and the split-attention model; not the 7B-shaped
# one, which takes too long instrumented) and over a short generation on each GPU path: fused
# (the default, the cluster step where the GPU has it; and a kernel per matrix, graph and plain
# launches; FP16 and FP32 caches), --unfused, --fp16, FP32 cuBLAS, and a prompt prefilled on the
# tensor cores then decoded as --batch 4. Each of memcheck, racecheck, initcheck and synccheck
# must report nothing. Ends with "N passed, N failed, N skipped".
# Knobs: TOOLS (a subset of the tools); PARTS (the suite's parts, "linear batch random long
# real" by default, i.e. all of it); SUITE=0 (no suite); GENS=0 (no generations); JOBS=N (N runs
# side by side, default 1: instrumented, the whole suite one run at a time takes tens of minutes);
# TIMEOUT=S (a run's limit in seconds, reported as a
# failure). The kernels' mbarriers are raw PTX, which synccheck does not count from the module;
# --num-cuda-barriers gives it room for them.
set -u
positive() {   # name value: a whole number above 0, else a message and exit 2
    case $2 in '' | *[!0-9]* | 0) echo "gpu_sanitize.sh: $1 must be a whole number above 0, got \"$2\"" >&2; exit 2 ;; esac
}
positive JOBS "${JOBS:-1}"
[ -z "${TIMEOUT:-}" ] || positive TIMEOUT "$TIMEOUT"
cd "$(dirname "$0")/.."
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
pass=0 fail=0
dir=$(mktemp -d) targets=$(mktemp)   # targets: one command per line
q8=models/stories260K_q8.bin f32=models/stories260K.bin T=models/tok512.bin
if [ "${SUITE:-1}" != 0 ]; then
    for p in ${PARTS:-linear batch random long real}; do echo "tests/test_run_gpu --gpu-only --quick --gpu-part $p models"; done
fi > "$targets"
if [ "${GENS:-1}" != 0 ]; then
    for flags in "" "--no-graph --no-pdl" "--kv-fp32" "--no-cluster-step" "--no-cluster-step --no-graph --no-pdl" \
        "--no-cluster-step --kv-fp32" "--unfused" "--fp16"; do
        echo "./run $q8 -z $T -n STEPS -t 0 $flags"
    done
    echo "./run $f32 -z $T -n STEPS -t 0"
    echo "./run $q8 -z $T -n 48 -t 0.8 -p Once.upon.a.time.there.was.a.little.girl --batch 4"
fi >> "$targets"
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
    # (racecheck follows every shared-memory access: the cluster step's hops keep x, the residual
    # stream and the weights' ring there, so its single-sequence generations are 6 positions, not
    # 48; the batch's prompt alone is 28)
    steps=48; [ "$tool" = racecheck ] && steps=6
    while IFS= read -r target; do echo "$tool $target" | sed "s/ -n STEPS / -n $steps /"; done < "$targets"
done > "$dir/jobs"
# One (tool, target) run; its output in $dir/N.log, its exit status in $dir/N.rc.
run_one() {
    extra=; [ "$1" = synccheck ] && extra="--num-cuda-barriers 64"
    ${TIMEOUT:+timeout "$TIMEOUT"} $CS --tool "$1" $extra --error-exitcode 9 $2 > "$dir/$3.log" 2>&1 < /dev/null
    echo $? > "$dir/$3.rc"
}
i=0
while read -r tool target; do
    i=$((i + 1))
    run_one "$tool" "$target" $i &
    [ $((i % ${JOBS:-1})) -eq 0 ] && wait
done < "$dir/jobs"
wait
i=0
while read -r tool target; do
    i=$((i + 1)) rc=$(cat "$dir/$i.rc")
    if [ "$rc" -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards" "$dir/$i.log"; then
        echo "PASS $tool: $target"; pass=$((pass + 1))
    else
        [ "$rc" -eq 124 ] && why="timed out after ${TIMEOUT}s" || why="exit $rc"
        echo "FAIL $tool: $target ($why)"
        grep -E "^=========|^FAIL" "$dir/$i.log" | head -12; fail=$((fail + 1))
    fi
done < "$dir/jobs"
rm -rf "$dir" "$targets"
echo "$pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
