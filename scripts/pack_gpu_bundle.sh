#!/usr/bin/env bash
# Packs what a GPU machine needs to run the CUDA build's checks into one ignored folder
# (default gpu-bundle/): build-cuda's programs and GPU tests, the Kokkos prefix's libraries, the
# shared libraries the device image likely lacks (from ldd: MPI, HDF5, yaml-cpp, OpenBLAS, ...;
# never libc, libstdc++ or the CUDA driver/toolkit, which the image has), the host losses
# (scripts/gpu_check.sh --host-losses writes them here first) and the configs and data. Binaries
# are stripped; the folder is also written as DIR.tar.gz. Prints the sizes; fails when the
# archive is above 64 MiB (what a session may carry).
#
#   scripts/pack_gpu_bundle.sh [--out DIR]
set -euo pipefail
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/gpu-bundle"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a folder}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "pack_gpu_bundle.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
bin="$repo/build-cuda/bin"
[ -d "$bin" ] || { echo "pack_gpu_bundle.sh: no $bin; build the cuda preset first" >&2; exit 1; }
rm -rf "$out/bin" "$out/lib" "$out/lib-mpi"
mkdir -p "$out/bin" "$out/lib" "$out/lib-mpi"
# Everything gpu_check.sh runs (the cuda-ci build preset's targets), and nothing else: a whole
# cuda build's other test binaries would only push the archive past its limit. A missing one is
# an error here, or a device session would find out the hard way.
progs=()
missing=()
for p in colossal_train colossal_plan colossal_bench colossal_generate colossal_eval \
         test_kernels_team test_attention_tc test_kernels test_gemm_cuda test_model_grad \
         test_decode test_nccl_communicator; do
  if [ -x "$bin/$p" ]; then progs+=("$bin/$p"); else missing+=("$p"); fi
done
# The host's losses of every model section 2 trains, complete and newer than the host build
# that wrote them (an interrupted or an older --host-losses run would fail every comparison).
for m in quickstart opt-tiny llama-quickstart quickstart-bf16 quickstart-fused quickstart-fused-bf16; do
  f="$repo/host-losses/$m.txt"
  if [ ! -f "$f" ] || [ "$(wc -l < "$f")" != 10 ] || [ "$f" -ot "$repo/build/bin/colossal_train" ]; then
    missing+=("host-losses/$m.txt, 10 lines newer than build/bin/colossal_train (scripts/gpu_check.sh --host-losses)")
  fi
done
compgen -G "$repo/data/licenses_*.txt" >/dev/null || missing+=("data/licenses_*.txt (scripts/prepare_data.sh)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "pack_gpu_bundle.sh: missing ${missing[*]}; make them first (programs:" \
       "'cmake --build --preset cuda-ci -j2'; host losses: scripts/gpu_check.sh --host-losses" \
       "after the host build; the data: scripts/prepare_data.sh)" >&2
  exit 1
fi
for f in "${progs[@]}"; do cp "$f" "$out/bin/"; done
cp -a "$repo"/.deps/kokkos-cuda/lib*/libkokkos*.so* "$out/lib/"
# Open MPI for a GPU machine without one: mpi/ mirrors the three folders Debian's Open MPI and
# PMIx find by their built-in paths (plugins, help texts), mpi/bin has the launcher, and the MPI
# stack's libraries go to lib-mpi/ instead of lib/. gpu_check.sh uses them only where the image
# has no Open MPI of its own: mixing this build's PMIx with an image's newer Open MPI fails
# ("undefined symbol: PMIx_Info_create", seen on the H200 image, which has Open MPI 4.1 with
# PMIx 5), and our binaries run on any Open MPI 4.x's libmpi.so.40.
mpi_dirs=(/usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi)
rm -rf "$out/mpi"
mpi_objects=()
if command -v orterun >/dev/null; then
  for d in "${mpi_dirs[@]}"; do
    [ -d "$d" ] || continue
    mkdir -p "$out/mpi$(dirname "$d")"
    cp -a "$d" "$out/mpi$d"
    rm -rf "$out/mpi$d/include"
  done
  mkdir -p "$out/mpi/bin"
  cp -L "$(command -v orterun)" "$out/mpi/bin/mpirun"
  mapfile -t mpi_objects < <(find "$out/mpi" -name '*.so*' -type f)
  mpi_objects+=("$out/mpi/bin/mpirun")
fi
# Libraries from ldd, minus what any Linux/CUDA image has.
skip='^(libc|libm|libdl|librt|libpthread|libresolv|libnsl|libutil|libanl|libgcc_s|libstdc\+\+|ld-linux-x86-64|linux-vdso|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z]*)\.so'
# The MPI stack: Open MPI's own libraries and what only its transports and launcher use.
mpi_stack='^(libmpi|libopen-pal|libopen-rte|liboshmem|libompitrace|libmca_common|libpmix|libhwloc|libevent|libuc[mpst]|libfabric|libpsm|libibverbs|librdmacm|libnl-|libefa|libinfinipath|libnuma)'
for f in "${progs[@]}" "${mpi_objects[@]}"; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $1" "$3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  dest=lib
  [[ "$name" =~ $mpi_stack ]] && dest=lib-mpi
  [ -e "$out/$dest/$name" ] || cp -L "$path" "$out/$dest/$name"
done
strip --strip-unneeded "$out"/bin/* "$out"/lib/*.so* "$out"/lib-mpi/*.so* 2>/dev/null || true
mkdir -p "$out/configs" "$out/data"
cp "$repo"/configs/*.yaml "$out/configs/"
cp "$repo"/data/licenses_*.txt "$out/data/"
# 100 multiple-choice questions from the validation text (gpu_check.sh section 2).
python3 "$repo/scripts/make_choices.py" text "$repo/data/licenses_val.txt" --examples 100 \
  --out "$out/data/licenses_choices.bin" > /dev/null
cp "$repo/scripts/gpu_check.sh" "$out/"
# Which source the bundle is: gpu_check.sh prints it at the top of its report.
echo "commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" \
  diff --quiet HEAD 2>/dev/null || echo ' with uncommitted changes'), packed $(date -u +%FT%TZ)" > "$out/BUNDLE"
cp -r "$repo/host-losses" "$out/"
[ -f "$repo/bench/pytorch_peer.py" ] && cp "$repo/bench/pytorch_peer.py" "$out/"
# The session carries the compressed archive (OpenBLAS alone is 36 MB unpacked); on the GPU
# machine: tar -xzf gpu-bundle.tar.gz && gpu-bundle/gpu_check.sh
tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
size=$(stat -c %s "$out.tar.gz")
echo "[pack] $out: $(du -sh "$out" | cut -f1) unpacked, ${#progs[@]} programs," \
     "$(ls "$out/lib" | wc -l) libraries; $out.tar.gz: $((size / 1024 / 1024)) MiB ($size bytes)"
[ "$size" -le $((64 * 1024 * 1024)) ] ||
  { echo "pack_gpu_bundle.sh: $out.tar.gz is over 64 MiB" >&2; exit 1; }
