#!/usr/bin/env bash
# test_exports.sh LIBRARY HEADER - the shared library exports exactly the functions the header declares
# with PKV_API: nothing internal leaks (hidden visibility), nothing declared is missing.
set -euo pipefail
lib=${1:?usage: test_exports.sh LIBRARY HEADER}
hdr=${2:?usage: test_exports.sh LIBRARY HEADER}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only "$lib" | awk '$2 ~ /^[TW]$/ {print $3}' | sort -u >"$tmp/exported"
grep -oE '^PKV_API [^(]*\(' "$hdr" | sed -E 's/\($//; s/.*[ *]([a-z_0-9]+)$/\1/' | sort -u >"$tmp/declared"
if ! diff -u "$tmp/declared" "$tmp/exported"; then
  echo "test_exports: the exported functions (+) differ from the header's PKV_API declarations (-)"
  exit 1
fi
echo "test_exports: $(wc -l <"$tmp/exported") functions exported, exactly the header's"
