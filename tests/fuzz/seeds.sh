#!/bin/sh
# Seed corpora for the fuzz targets (tests/fuzz/corpus/<target>): the real files in
# ../shared/models (or models/), small synthetic checkpoints in every format, sample texts and
# command lines, and every regression file kept under tests/fuzz/regressions/<target>.
set -eu
cd "$(dirname "$0")/../.."
c=tests/fuzz/corpus
mkdir -p $c/model $c/tokenizer $c/encode $c/run_args $c/quantize_args
src=${SHARED_MODELS:-../shared/models}; [ -d "$src" ] || src=models
# checkpoints: v0, v1, v2 and Q8LM of one small model, a shared-classifier Q8LM, the real ones
./tests/test_run --fixtures $c/model > /dev/null
./quantize --synthetic 16,24,1,2,1,40,8 $c/model/q8_shared.bin -g 8 2> /dev/null
for f in stories260K.bin stories260K_q80_gs8.v2.bin aidreams260K.bin; do [ -f "$src/$f" ] && cp "$src/$f" $c/model/; done
# tokenizers: 2 bytes of vocabulary size (value + 1), then the file
for f in tok512.bin aidreams_tok512.bin; do
    [ -f "$src/$f" ] && { printf '\377\001'; cat "$src/$f"; } > $c/tokenizer/$f
done
printf '\002\000\001\000\000\000\000\000\000\000\001\000\000\000a\000\000\200?\001\000\000\000b' > $c/tokenizer/tiny
# texts
head -c 2000 tests/data/story.txt > $c/encode/story
head -c 2000 tests/data/code.txt > $c/encode/code
printf 'caf\303\251 \342\234\223 \360\237\230\200 \377\376 \300\200 end\000second text' > $c/encode/utf8
# command lines: NUL-separated arguments
printf 'm.bin\000-p\000Once upon a time\000-n\000256\000-t\0000.8\000--top-p\0000.9\000-s\00042' > $c/run_args/full
printf 'm.bin\000--device\000cpu\000--unfused\000--no-graph\000--ppl\000x.txt\000-z\000t.bin' > $c/run_args/flags
printf 'm.bin\000--fp16\000--kv-fp32\000--batch\00016' > $c/run_args/paths
printf 'in.bin\000out.bin\000-g\00064' > $c/quantize_args/convert
printf -- '--synthetic\000llama2-7b\000out.bin\000--fp32\000--seed\0007' > $c/quantize_args/preset
printf -- '--synthetic\00032,40,2,4,2,-50,16\000out.bin\000-g\0008' > $c/quantize_args/shape
for t in model tokenizer encode run_args quantize_args; do
    [ -d tests/fuzz/regressions/$t ] && cp tests/fuzz/regressions/$t/* $c/$t/ 2> /dev/null || true
done
echo "seeds: $(for t in model tokenizer encode run_args quantize_args; do printf '%s %s  ' $t "$(ls $c/$t | wc -l)"; done)"
