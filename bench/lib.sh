# Shared by bench.sh, ab.sh and tune.sh (sourced from the project's root, with $out set): the
# synthetic checkpoints, the prompts of a length and the decode rate, alike in all three, so that
# their rows compare.
# A synthetic checkpoint of a quantize preset in $out, made once: name [--fp32]; prints its path.
synth() {
    f="$out/$1${2:+.f32}.bin"
    [ -f "$f" ] || ${QUANTIZE:-./quantize} --synthetic "$1" ${2:-} "$f" 2>/dev/null
    echo "$f"
}
# A prompt of about n tokens (tokenizer.bin: each repeat of the sentence is 8 tokens).
prompt_of() { awk -v n="$1" 'BEGIN { for (i = 0; i < n / 8; i++) printf "The cat sat on the mat. "; }'; }
# The decode tok/s a run printed on stderr (file $1); with --batch, the aggregate tok/s.
rate() {
    awk '/decode/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "tok/s;" && $(i-1) == "decode") d = $i;
                                               if ($(i+1) == "tok/s" && $(i+2) == "aggregate,") a = $i } }
         END { print a ? a : d }' "$1"
}
