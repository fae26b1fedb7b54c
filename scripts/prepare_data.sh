#!/usr/bin/env bash
# Writes the quickstart corpus: the license texts every Debian system ships in
# /usr/share/common-licenses (about 250 KB of English), concatenated in a fixed order, split 90/10
# into data/licenses_train.txt and data/licenses_val.txt. Idempotent; --force rewrites.
set -euo pipefail
usage() {
  echo "usage: scripts/prepare_data.sh [--force] [--out DIR]"
  echo "Writes DIR/licenses_train.txt and DIR/licenses_val.txt (DIR defaults to data/)."
}
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/data"
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --force) force=1 ;;
    --out) out="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "prepare_data.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
src=/usr/share/common-licenses
train="$out/licenses_train.txt"
val="$out/licenses_val.txt"
if [ "$force" = 0 ] && [ -s "$train" ] && [ -s "$val" ]; then
  exit 0
fi
if [ ! -d "$src" ]; then
  echo "prepare_data.sh: $src is missing (it comes with Debian's base-files package)" >&2
  exit 1
fi
mkdir -p "$out"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
# Regular files only (GPL, LGPL, GFDL are symlinks to versioned files), in C-locale order.
find "$src" -maxdepth 1 -type f | LC_ALL=C sort | while read -r f; do cat "$f"; echo; done > "$tmp"
bytes=$(stat -c %s "$tmp")
cut=$((bytes * 9 / 10))
head -c "$cut" "$tmp" > "$train.part"
tail -c +"$((cut + 1))" "$tmp" > "$val.part"
mv "$train.part" "$train"
mv "$val.part" "$val"
echo "prepare_data.sh: wrote $train ($cut bytes) and $val ($((bytes - cut)) bytes)"
