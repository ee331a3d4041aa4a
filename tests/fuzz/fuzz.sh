#!/bin/sh
# Runs each fuzz target for SECONDS on its corpus (tests/fuzz/corpus/<target>), with the
# dictionary of header magics. A crash leaves its input in tests/fuzz/crashes/ and fails the run;
# the totals (executions, corpus size) are appended to tests/fuzz/stats.log.
# Usage: fuzz.sh SECONDS target...
set -u
cd "$(dirname "$0")/../.."
seconds=$1; shift
mkdir -p tests/fuzz/crashes
failed=0
for t in "$@"; do
    log=tests/fuzz/corpus/$t.log
    dict=""; [ "$t" = model ] && dict=-dict=tests/fuzz/checkpoint.dict
    [ -f tests/fuzz/$t.dict ] && dict=-dict=tests/fuzz/$t.dict
    mkdir -p tests/fuzz/corpus/$t
    seeds=""   # the readers' fixtures seed their corpora
    case $t in json) seeds=tests/data/json ;; safetensors) seeds=tests/data/safetensors/fuzz ;; gguf) seeds=tests/data/gguf ;;
        bpe_json) seeds=tests/data/bpe; dict=-dict=tests/fuzz/bpe_json.dict ;; esac
    max_len=65536; [ "$t" = encode ] && max_len=1024   # encode is quadratic in the text: keep runs fast
    ./tests/fuzz/fuzz_$t -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=$max_len $dict \
        -artifact_prefix=tests/fuzz/crashes/$t- -print_final_stats=1 tests/fuzz/corpus/$t $seeds > "$log" 2>&1
    rc=$?
    execs=$(awk '/stat::number_of_executed_units/ { print $2 }' "$log")
    corpus=$(ls tests/fuzz/corpus/$t | wc -l)
    line="$(date -u +%FT%TZ) $t: ${seconds}s, ${execs:-?} executions, corpus $corpus, exit $rc"
    echo "$line" | tee -a tests/fuzz/stats.log
    if [ $rc -ne 0 ]; then failed=1; grep -E "ERROR|runtime error|SUMMARY" "$log" | head -5; fi
done
exit $failed
