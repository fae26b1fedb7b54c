#!/usr/bin/env bash
# Regenerates the checkpoint seed corpus (tests/fuzz/corpus/checkpoint/seeds/): checkpoints that
# colossal_train writes for the tiny model the fuzz entry reads them for (fuzz_entries.cpp,
# reference_config), a checkpoint of another model, a model file, and damaged copies (truncated,
# a byte flipped in HDF5 metadata, empty, not HDF5).
#   usage: tests/fuzz/make_checkpoint_seeds.sh [BIN_DIR]    (default build/bin)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$root/build/bin}
out=$root/tests/fuzz/corpus/checkpoint/seeds
work=$(mktemp -d /tmp/colossal-seeds.XXXXXX)
trap 'rm -rf "$work"' EXIT
[ -x "$bin/colossal_train" ] || { echo "make_checkpoint_seeds.sh: no $bin/colossal_train (build first)" >&2; exit 2; }

# llm.c token file: 256 int32 header (magic 20240520, version 1, count), then uint16 tokens < 16.
python3 - "$work/tokens.bin" <<'EOF'
import struct, sys
tokens = [(i * 7 + i // 5) % 16 for i in range(400)]
header = [20240520, 1, len(tokens)] + [0] * 253
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
EOF
# Must match reference_config() in fuzz_entries.cpp.
cat > "$work/tiny.yaml" <<EOF
model: {arch: gpt2, layers: 1, hidden: 8, heads: 2, ffn_hidden: 16, vocab: 16, max_seq: 8, vocab_multiple: 1}
data: {path: $work/tokens.bin}
train: {steps: 2, seq_len: 8, global_batch: 2, micro_batch: 1}
eval: {every: 0}
sample: {tokens: 0}
checkpoint: {every: 1, keep: 2}
log: {every: 100, dir: $work/gpt2}
EOF
"$bin/colossal_train" "$work/tiny.yaml" > "$work/gpt2.log"
"$bin/colossal_train" "$work/tiny.yaml" --set model.arch=opt --set log.dir="$work/opt" > "$work/opt.log"

mkdir -p "$out"
rm -f "$out"/*
cp "$work/gpt2/checkpoints/ckpt-2.h5" "$out/valid-step2.h5"
cp "$work/opt/checkpoints/ckpt-2.h5" "$out/other-model-opt.h5"
cp "$work/gpt2/model.h5" "$out/model-file-not-checkpoint.h5"
size=$(stat -c %s "$out/valid-step2.h5")
head -c $((size / 2)) "$out/valid-step2.h5" > "$out/truncated-half.h5"
head -c 96 "$out/valid-step2.h5" > "$out/truncated-in-header.h5"
: > "$out/empty.h5"
printf 'not an HDF5 file\n' > "$out/text.h5"
# Flip one byte at OFFSET (xor 0xff) in a copy.
flip() {
  python3 - "$out/valid-step2.h5" "$out/$1" "$2" <<'EOF'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
offset = int(sys.argv[3]) % len(data)
data[offset] ^= 0xFF
open(sys.argv[2], "wb").write(bytes(data))
EOF
}
flip flipped-metadata.h5 800
ls -l "$out"
du -sh "$out"
