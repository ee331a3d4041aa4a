# Sums Nsight Compute's source page of one kernel (ncu --page source --csv --print-source sass,
# fields split on '","'; the file given twice, after bench/ncu_csv.awk): the warps' stall samples
# by reason and the 12 instructions with the most, and the executed warp instructions by class.
# Instructions after the kernel's last EXIT (the waits' retry loops, the slow paths of division and
# square root) are counted apart from the main code.
function class_of(op) {
    if (op ~ /^(IDP|I2FP|I2F)$/) return "dp4a and conversions"
    if (op ~ /^(FFMA|FMUL|FADD|FMNMX|FRND|F2I|MUFU|FCHK|FSETP|FSEL|HADD2|HFMA2|F2FP)$/) return "floating point"
    if (op ~ /^(LDS|STS|STAS)$/) return "shared memory"
    if (op == "SHFL") return "shuffles"
    if (op ~ /^(BRA|BSSY|BSYNC|WARPSYNC|BAR|YIELD|CALL|RET|EXIT|NOP|BREAK)$/) return "branches, barriers, reconvergence"
    if (op ~ /^(LDG|STG|LD|ST|SYNCS|CCTL|MEMBAR|UBLKCP|UTMALDG|ATOM|RED|UCGABAR_ARV|UCGABAR_WAIT|ERRBAR|CGAERRBAR|LDC|ACQBULK)$/) return "global, mbarriers, fences"
    return "integer and addresses"
}
FNR == 1 { pass++ }
pass == 1 && FNR == 2 {
    if (!ncu_header("ncu_source.awk")) { bad = 1; exit 1 }
    next
}
pass == 1 && FNR > 2 && NF > 10 {
    if (first == "") first = hex($1)
    if ($2 ~ /^ *EXIT/) last_exit = hex($1)
}
pass == 2 && FNR > 2 && NF > 10 {
    s = num($col["Warp Stall Sampling (All Samples)"]); e = num($col["Instructions Executed"])
    samples += s
    for (i = 1; i <= NF; i++) if (name[i] ~ /^stall_/ && name[i] !~ /Not Issued/) by_reason[name[i]] += num($i)
    src = $2; sub(/^ +/, "", src); split(src, w, / +/); op = (w[1] ~ /^@/) ? w[2] : w[1]; sub(/\..*/, "", op)
    at = hex($1) - first
    if (at > last_exit - first) { outline += e; outline_s += s; next }
    main += e; by_class[class_of(op)] += e
    top[at] = s; text[at] = src
}
END {
    if (bad) exit 1
    if (main == 0) { print "ncu_source.awk: " FILENAME ": no instructions executed in the source page" > "/dev/stderr"; exit 1 }
    printf "stall samples: %d (%d of them after the last EXIT: retry loops, slow paths)\n", samples, outline_s
    for (r in by_reason) if (by_reason[r] > 0) printf "  %5.1f%%  %s\n", 100 * by_reason[r] / samples, r | "sort -nr"
    close("sort -nr")
    print "instructions with the most samples (offset from the kernel's start):"
    for (k = 0; k < 12; k++) {
        best = ""; for (a in top) if (best == "" || top[a] > top[best]) best = a
        if (best == "" || top[best] == 0) break
        printf "  %6d  0x%05x  %s\n", top[best], best, text[best]; delete top[best]
    }
    printf "warp instructions executed: %d in the main code, %d after the last EXIT\n", main, outline
    for (c in by_class) printf "  %5.1f%%  %s\n", 100 * by_class[c] / main, c | "sort -nr"
    close("sort -nr")
}
