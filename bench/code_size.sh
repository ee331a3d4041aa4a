#!/bin/sh
# The step kernels' machine code, kernel by kernel: the bytes of each instance's .text in a cubin
# for sm_90a (the megakernel's mega_kernel, the cluster step's cs_layers_kernel and
# cs_classifier_kernel). Their size is speed (bench/NOTES.md 95, 103, 148, 149), and this needs
# nvcc and binutils only, no GPU: a change's kernels can be compared with the head's before they
# are timed.
#   sh bench/code_size.sh [nvcc flags, e.g. -DMK_SLOTS=24]
set -eu
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
for tool in "$NVCC" readelf c++filt; do
    command -v "$tool" > /dev/null || { echo "code_size.sh: $tool not found (nvcc, and binutils' readelf and c++filt)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$NVCC" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iengine "$@" -cubin kernels.cu -o "$tmp/k.cubin"
readelf -SW "$tmp/k.cubin" 2>/dev/null | awk '$2 ~ /^\.text\..*(mega_kernel|cs_layers_kernel|cs_classifier_kernel)/ { print $2, $6 }' > "$tmp/sections"
[ -s "$tmp/sections" ] || { echo "code_size.sh: no step kernel's code in the cubin (built without sm_90a?)" >&2; exit 1; }
while read -r section size; do
    printf "%8d  %s\n" "$((0x$size))" "$(echo "${section#.text.}" | c++filt | sed 's/(anonymous namespace):://g')"
done < "$tmp/sections"
