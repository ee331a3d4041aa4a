# Nsight Compute's source page of one kernel (ncu --page source --csv --print-source sass, fields
# split on '","') summed by source line, through the machine code's line table (nvdisasm -g -c of
# the build's cubin; NVFLAGS carry -lineinfo). Usage:
#   awk -F'","' -f bench/ncu_csv.awk -f bench/ncu_lines.awk kernels.sass step.csv
# The kernel is found in the listing by its instructions, which must match the profile's (the
# same build; of kernels alike to the last instruction, the first); a line of source is printed for each of the lines with the most stall samples
# and the most instructions executed, with their shares and the two largest stall reasons.
function opcode(text,    w) {   # the instruction's opcode with its modifiers, no predicate
    sub(/^ +/, "", text); split(text, w, / +/)
    return (w[1] ~ /^@/) ? w[2] : w[1]
}
function text_of(loc,    f, n, i, line, path) {   # the source line "file:N" as it reads, trimmed
    path = loc; sub(/:[0-9]+$/, "", path); n = loc; sub(/^.*:/, "", n); n += 0
    line = ""
    for (i = 1; i <= n && (getline line < path) > 0; i++) {}
    close(path)
    if (i <= n) return ""
    sub(/^[ \t]+/, "", line)
    return substr(line, 1, 90)
}
function top(arr, total, what, shown,    k, best, bestk, i, s, file) {
    printf "%s (of %d):\n", what, total
    for (i = 0; i < shown; i++) {
        best = -1
        for (k in arr) if (!(k in used) && arr[k] > best) { best = arr[k]; bestk = k }
        if (best <= 0) break
        used[bestk] = 1
        s = reasons_of(bestk)
        file = bestk; sub(/^.*\//, "", file)
        printf "  %5.1f%%  %-24s %-34s %s\n", 100 * best / total, file, s, text_of(bestk)
    }
    split("", used)
}
function reasons_of(loc,    k, a, b, ka, kb, p) {   # its two largest stall reasons, "reason n"
    a = b = 0; ka = kb = ""
    for (k in stall) {
        split(k, p, SUBSEP)
        if (p[1] != loc) continue
        if (stall[k] > a) { b = a; kb = ka; a = stall[k]; ka = p[2] }
        else if (stall[k] > b) { b = stall[k]; kb = p[2] }
    }
    sub(/^stall_/, "", ka); sub(/^stall_/, "", kb)
    return a ? ka " " a (b ? ", " kb " " b : "") : ""
}
BEGIN { rows = 0 }
FNR == 1 { pass++ }
pass == 1 {   # the listing: sections, line-table entries, instructions
    if ($0 ~ /^\.text\./) { section = $0; sub(/:$/, "", section); next }
    if (match($0, /\/\/## File "[^"]*", line [0-9]+/)) {
        s = substr($0, RSTART, RLENGTH); f = s; sub(/^\/\/## File "/, "", f); sub(/".*$/, "", f)
        l = s; sub(/^.*line /, "", l); loc = f ":" l; next
    }
    if (section != "" && match($0, /\/\*[0-9a-f]+\*\/ +[^;]*;/)) {
        a = substr($0, RSTART + 2); sub(/\*\/.*/, "", a)
        ins = substr($0, RSTART, RLENGTH); sub(/^\/\*[0-9a-f]+\*\/ +/, "", ins); sub(/ *;$/, "", ins)
        at[section, hex("0x" a)] = loc
        sig[section] = sig[section] " " opcode(ins)
    }
    next
}
pass == 2 && FNR == 2 {
    if (!ncu_header("ncu_lines.awk")) { bad = 1; exit 1 }
    next
}
pass == 2 && FNR > 2 && NF > 10 {
    if (rows == 0) base = hex($1)
    off[rows] = hex($1) - base; ex[rows] = num($col["Instructions Executed"]); sm[rows] = num($col["Warp Stall Sampling (All Samples)"])
    for (i = 1; i <= NF; i++) if (name[i] ~ /^stall_/ && name[i] !~ /Not Issued/ && num($i) > 0) rs[rows] = rs[rows] name[i] "=" num($i) " "
    csv_sig = csv_sig " " opcode($2)
    rows++
}
END {
    if (bad) exit 1
    if (rows == 0) { printf "ncu_lines.awk: %s: no instructions (empty, or not ncu's source page as CSV)\n", FILENAME > "/dev/stderr"; exit 1 }
    for (s in sig) if (sig[s] == csv_sig && (kernel == "" || s < kernel)) kernel = s
    if (kernel == "") {
        printf "ncu_lines.awk: %s: no kernel of the listing has the profiled one's instructions (another build?)\n", FILENAME > "/dev/stderr"
        exit 1
    }
    for (r = 0; r < rows; r++) {
        if (!((kernel, off[r]) in at)) { missing++; continue }
        loc = at[kernel, off[r]]
        by_ex[loc] += ex[r]; by_sm[loc] += sm[r]; all_ex += ex[r]; all_sm += sm[r]
        n = split(rs[r], w, " ")
        for (i = 1; i <= n; i++) { split(w[i], p, "="); stall[loc, p[1]] += p[2] }
    }
    if (missing) printf "ncu_lines.awk: %d of the profile's %d instructions not in the listing's kernel\n", missing, rows > "/dev/stderr"
    sub(/^\.text\./, "", kernel)
    print "by source line, " kernel ":"
    top(by_sm, all_sm, "stall samples", 25)
    top(by_ex, all_ex, "warp instructions executed", 25)
}
