#!/usr/bin/env bash
# The bundled demo corpus: Debian's `fortunes` package (about 2.5 MB of quotations, jokes and
# verse in English), its files concatenated with the "%" separators turned into blank lines.
# Installed from the package registry, never downloaded at run time. Usage: make_corpus.sh OUT
set -euo pipefail
out=${1:?usage: make_corpus.sh OUT.txt}
src=/usr/share/games/fortunes
if [ ! -d "$src" ]; then
  echo "error: $src is missing: apt-get install fortunes" >&2
  exit 2
fi
tmp="$out.tmp.$$"
find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
  xargs -0 cat | sed 's/^%$//' > "$tmp"
mv "$tmp" "$out"
echo "corpus: $out ($(wc -c < "$out") bytes)" >&2
