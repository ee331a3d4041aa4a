# What bench/ncu_source.awk and bench/ncu_lines.awk share: Nsight Compute's source page as CSV
# (ncu --page source --csv --print-source sass), its fields split on '","'. Given first:
#   awk -F'","' -f bench/ncu_csv.awk -f bench/ncu_source.awk ...
function num(v) { gsub(/[",]/, "", v); return v + 0 }
function hex(v,    i, n, d) {   # "0x..." (with or without the field's quote) as a number
    gsub(/[" ]/, "", v); n = 0
    for (i = 3; i <= length(v); i++) { d = index("0123456789abcdef", tolower(substr(v, i, 1))) - 1; n = n * 16 + d }
    return n
}
# The header row (the page's second line): col[name] its column, name[i] column i's name; 0, with
# a line naming the script and the file, where the page's columns are not there.
function ncu_header(script,    i, h) {
    for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); col[h] = i; name[i] = h }
    if (("Warp Stall Sampling (All Samples)" in col) && ("Instructions Executed" in col)) return 1
    print script ": " FILENAME ": no 'Warp Stall Sampling (All Samples)' or 'Instructions Executed' column (not ncu's source page as CSV?)" > "/dev/stderr"
    return 0
}
