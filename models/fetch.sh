#!/bin/sh
# fetch.sh NAME DEST SHARED_DIR: puts model file NAME at DEST, copied from SHARED_DIR when it has it,
# else downloaded from upstream; either way its sha256 is checked against models/README.md's table.
set -eu
name=$1 dest=$2 shared=$3
here=$(dirname "$0")
want=$(awk -v n="$name" -F'|' '{gsub(/ /,"",$2)} $2==n {gsub(/ /,"",$4); print $4}' "$here/README.md")
url=$(awk -v n="$name" -F'|' '{gsub(/ /,"",$2)} $2==n {gsub(/ /,"",$5); print $5}' "$here/README.md")
[ -n "$want" ] || { echo "fetch.sh: $name is not in models/README.md" >&2; exit 1; }
if [ -f "$shared/$name" ]; then
    cp "$shared/$name" "$dest.tmp"
elif [ "$url" != "-" ] && command -v curl >/dev/null; then
    echo "fetch.sh: downloading $name from $url" >&2
    curl -fsSL "$url" -o "$dest.tmp" || { echo "fetch.sh: download of $name failed" >&2; rm -f "$dest.tmp"; exit 1; }
else
    echo "fetch.sh: $name: not in $shared and no download recipe (or no curl); copy it to $dest by hand" >&2
    exit 1
fi
got=$(sha256sum "$dest.tmp" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
    echo "fetch.sh: $name: sha256 $got, expected $want" >&2
    rm -f "$dest.tmp"
    exit 1
fi
mv "$dest.tmp" "$dest"
