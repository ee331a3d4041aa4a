#!/bin/sh
# The cluster step's measurement builds (cuda/cluster_step.cuh's CS_... options) against the
# tree's build, all in one run on a machine with a GPU:
#   1. every variant built side by side, and its --cluster-step decode rate on bench.sh's synthetic
#      stories15m and SmolLM2 shape, PASSES rounds (bench/tune.sh; the tree's build is variant 1;
#      ROWS=none: built only);
#   2. each variant's 200 greedy tokens of stories260K (INT8, FP16 and FP32 caches), 100 of the
#      synthetic stories15m and SmolLM2 shape, and 40 of two wide synthetic models (576 wide: GQA
#      3; 1,024: GQA 4, 8 groups of 128; heads of 64) against the per-matrix path's
#      (--no-megakernel --no-cluster-step) of the tree's build;
#   3. with TESTS="N ..." (variant numbers): those variants' GPU suite (tests/test_run_gpu
#      --gpu-only --quick models, linked with the variant's kernels: make tune-test-variant);
#   4. with TRACE="N ...": those variants built again with CS_TRACE, and the cluster step's trace
#      of one step (each kind of hop's phases, each warp's ticks) on the same two synthetic models;
#   5. compute-sanitizer (TOOLS, default racecheck memcheck synccheck) over a short generation
#      with --cluster-step of each variant in SANITIZE (variant numbers; unset: all, empty: none)
#      on each of SAN_MODELS (default "stories260K wide576 wide1024"; 6 tokens, the wide models 3:
#      racecheck of the 1,024-wide one at 6 ran past its timeout, bench/NOTES.md 179), JOBS (default
#      6) runs side by side, each at most TIMEOUT seconds (default 240).
# A run of steps 1 and 2 that takes over RUN_TIMEOUT seconds (default 120) fails: a variant whose
# schedule hangs fails there (in step 1 the script ends), rather than holding the machine to its limit.
# Ends with "N passed, N failed, 0 skipped" over steps 2, 3 and 5.
# Usage (a machine with a GPU, models/stories260K.bin and models/tok512.bin present: make models):
#   sh bench/cluster_ab.sh "-DCS_A" "-DCS_A -DCS_B"
#   TRACE=1 SANITIZE= sh bench/cluster_ab.sh            (no variants: the tree's build alone)
set -eu
cd "$(dirname "$0")/.."
for v in ${TESTS:-} ${TRACE:-} ${SANITIZE:-}; do   # variant numbers: 1 (the tree's) to $# + 1
    case $v in *[!0-9]*) n=0 ;; *) n=$v ;; esac
    [ "$n" -ge 1 ] && [ "$n" -le $(($# + 1)) ] ||
        { echo "cluster_ab.sh: TESTS, TRACE and SANITIZE name variants 1 to $(($# + 1)), got \"$v\"" >&2; exit 2; }
done
for sm in ${SAN_MODELS-stories260K wide576 wide1024}; do
    case $sm in stories260K | wide576 | wide1024) ;; *) echo "cluster_ab.sh: SAN_MODELS names stories260K, wide576 and wide1024, got \"$sm\"" >&2; exit 2 ;; esac
done
for knob in "JOBS=${JOBS:-6}" "TIMEOUT=${TIMEOUT:-240}"; do   # whole numbers above 0
    case ${knob#*=} in '' | *[!0-9]* | 0) echo "cluster_ab.sh: ${knob%%=*} must be a whole number above 0, got \"${knob#*=}\"" >&2; exit 2 ;; esac
done
tune=bench/out/tune m=models/stories260K_q8.bin T=models/tok512.bin
mkdir -p "$tune"
defs_of() {   # variant number: its -D options
    i=0
    for d in "" "$@"; do
        i=$((i + 1))
        [ $i -eq "$n" ] && { echo "$d"; return; }
    done
}
label_of() { defs_of "$@" | sed 's/^$/as it is/'; }
# Every build at once (the variants, and those in TRACE again with CS_TRACE), before any timing;
# with TESTS, the suite and ./run (which its command-line checks run) beside them.
make -s quantize tokenizer.bin tune-objects
[ -z "${TESTS:-}" ] || { make -s run tests/test_run_gpu > "$tune/tests_build.log" 2>&1 & }
n=0
for defs in "" "$@"; do
    n=$((n + 1))
    rm -f "$tune/$n/run"
    make -s tune-variant TUNE_DIR="$tune/$n" TUNE_DEFS="$defs" > "$tune/$n.log" 2>&1 &
done
for n in ${TRACE:-}; do
    rm -f "$tune/trace$n/run"
    make -s tune-variant TUNE_DIR="$tune/trace$n" TUNE_DEFS="$(defs_of "$@") -DCS_TRACE" > "$tune/trace$n.log" 2>&1 &
done
wait
n=0
for defs in "" "$@"; do
    n=$((n + 1))
    [ -x "$tune/$n/run" ] || { echo "cluster_ab: variant $n ($defs) failed to build:"; cat "$tune/$n.log"; exit 1; }
done
[ "${ROWS:-}" = none ] || TUNE_BUILT=1 ROWS=${ROWS:-stories15m smollm2} FLAGS=${FLAGS:--t 0 --cluster-step} sh bench/tune.sh "" "$@"
make -s models/stories260K_q8.bin
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
pass=0 fail=0
verdict() {   # what, status (0: passed)
    if [ "$2" -eq 0 ]; then echo "PASS $1"; pass=$((pass + 1)); else echo "FAIL $1"; fail=$((fail + 1)); fi
}
# The per-matrix path's text of the tree's build, once (in ref; absent where that run failed, so
# that every variant's text then fails), and whether a variant's --cluster-step text equals it.
reference() {   # ref, run's arguments
    ref=$1; shift
    "$tune/1/run" "$@" -t 0 --no-megakernel --no-cluster-step > "$ref" 2> /dev/null || rm -f "$ref"
}
same_text() {   # variant, ref, run's arguments
    v=$1 ref=$2; shift 2
    [ -f "$ref" ] && timeout "${RUN_TIMEOUT:-120}" "$tune/$v/run" "$@" -t 0 --cluster-step > "$tune/cs.txt" 2> "$tune/cs.err" &&
        grep -q "decode cluster step" "$tune/cs.err" && cmp -s "$ref" "$tune/cs.txt"
}
for kv in "" --kv-fp32; do reference "$tune/ref$kv.txt" $m -z $T -n 200 $kv; done
sanitize() {   # variant, model (SAN_MODELS), tool: its log in $tune/san_<variant>_<model>_<tool>.log, its status in .rc
    extra=; [ "$3" = synccheck ] && extra="--num-cuda-barriers 64"
    case $2 in stories260K) f=$m len=6 ;; wide576) f=$wide576 len=3 ;; *) f=$wide1024 len=3 ;; esac
    log=$tune/san_$1_$2_$3 rc=0
    timeout "${TIMEOUT:-240}" "$CS" --tool "$3" $extra --error-exitcode 9 "$tune/$1/run" "$f" -z $T -n $len -t 0 --cluster-step \
        > "$log.log" 2>&1 < /dev/null || rc=$?
    if [ $rc -eq 0 ] && ! grep -q "ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards" "$log.log"; then rc=8; fi
    echo $rc > "$log.rc"
}
out=bench/out
. bench/lib.sh   # synth
# The synthetic models: name, checkpoint, tokenizer, tokens. The wide ones (vocabulary 512) take
# tok512.bin.
wide576=$(synth 576,1536,2,9,3,512,64) wide1024=$(synth 1024,1536,2,16,4,512,64)
synthetic="stories15m|$(synth stories15m)|tokenizer.bin|100 smollm2|$(synth smollm2-135m)|tokenizer.bin|100
           wide576|$wide576|$T|40 wide1024|$wide1024|$T|40"
fields() {   # a spec of $synthetic: name, f (checkpoint), tok (tokenizer), len (tokens)
    IFS='|' read -r name f tok len <<EOS
$1
EOS
}
for spec in $synthetic; do
    fields "$spec"
    reference "$tune/ref_$name.txt" "$f" -z "$tok" -p "Once upon a time" -n "$len"
done
n=0
for defs in "" "$@"; do
    n=$((n + 1))
    for kv in "" --kv-fp32; do
        st=0; same_text $n "$tune/ref$kv.txt" $m -z $T -n 200 $kv || st=1
        verdict "variant $n (${defs:-as it is}) text ${kv:-fp16 cache}" $st
    done
    for spec in $synthetic; do
        fields "$spec"
        st=0; same_text $n "$tune/ref_$name.txt" "$f" -z "$tok" -p "Once upon a time" -n "$len" || st=1
        verdict "variant $n (${defs:-as it is}) text $name, $len tokens" $st
    done
done
if [ -n "${TESTS:-}" ]; then
    make -s run tests/test_run_gpu || cat "$tune/tests_build.log"
    for n in $TESTS; do
        st=0
        make -s tune-test-variant TUNE_DIR="$tune/$n" > "$tune/tests$n.out" 2>&1 &&
            "$tune/$n/test_run_gpu" --gpu-only --quick models > "$tune/tests$n.out" 2>&1 || st=$?
        verdict "variant $n ($(label_of "$@")) GPU suite: $(tail -1 "$tune/tests$n.out")" $st
        [ $st -eq 0 ] || grep "^FAIL" "$tune/tests$n.out" | head -10
    done
fi
if [ -n "${TRACE:-}" ]; then
    for n in $TRACE; do
        for model in stories15m smollm2-135m; do
            echo "trace of variant $n ($(label_of "$@")), $model:"
            "$tune/trace$n/run" "$(synth $model)" -z tokenizer.bin -p "Once upon a time" -n 200 -t 0 --cluster-step 2>&1 > /dev/null |
                grep "cluster step" || { echo "(no trace)"; cat "$tune/trace$n.log"; }
        done
    done
fi
sanitized=${SANITIZE-$(seq $(($# + 1)))}
jobs=0
san_models=${SAN_MODELS-stories260K wide576 wide1024}
for n in $sanitized; do
    for model in $san_models; do
        for tool in ${TOOLS:-racecheck memcheck synccheck}; do
            sanitize $n $model $tool &
            jobs=$((jobs + 1))
            [ $((jobs % ${JOBS:-6})) -eq 0 ] && wait
        done
    done
done
wait
for n in $sanitized; do
    defs=$(defs_of "$@")
    for model in $san_models; do
        for tool in ${TOOLS:-racecheck memcheck synccheck}; do
            log=$tune/san_${n}_${model}_$tool
            rc=$(cat "$log.rc")
            verdict "variant $n (${defs:-as it is}) $tool, $model$([ "$rc" = 124 ] && echo ", timed out")" "$rc"
            [ "$rc" -eq 0 ] || grep -E "^=========" "$log.log" | head -6
        done
    done
done
echo "$pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
