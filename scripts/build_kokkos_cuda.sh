#!/usr/bin/env bash
# Fetches Kokkos 3.4.01 (the only Kokkos source the registries serve: PyPI's pykokkos-base 0.0.7
# sdist, folder external/kokkos), applies cmake/patches/kokkos-3.4.01-cuda13.patch (CUDA 13 and
# Hopper fixes) and installs Serial + OpenMP + CUDA (lambdas, C++20, shared libs) into a prefix.
# With --openmp: Serial + OpenMP only, with the host compiler (no CUDA needed), the build whose
# thread teams check the device kernels on the CPU (scripts/check_team_kernels.sh).
# Idempotent: a stamp in the prefix records the patch's hash and the options; a second run with
# the same ones returns in seconds.
#
#   scripts/build_kokkos_cuda.sh [--openmp] [--prefix DIR] [--arch ARCH] [--jobs N] [--force]
#     --openmp       Serial + OpenMP only (default prefix .deps/kokkos-openmp)
#     --prefix DIR   install prefix (default: .deps/kokkos-cuda in the repository)
#     --arch ARCH    Kokkos GPU arch option: HOPPER90 (default, sm_90), AMPERE80, AMPERE86, ...
#     --jobs N       build jobs (default: nproc)
#     --force        rebuild even when the stamp matches
#   Needs: python3 -m pip (downloads 3.4 MB from PyPI), cmake >= 3.16, patch, CUDA in
#   $CUDA_HOME or /usr/local/cuda. Sources and the build tree live in .deps/src (ignored).
set -euo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=""
backend=cuda
arch=HOPPER90
jobs=$(nproc 2>/dev/null || echo 2)
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --openmp) backend=openmp ;;
    --prefix) prefix=${2:?--prefix needs a folder}; shift ;;
    --arch) arch=${2:?--arch needs a Kokkos arch name such as HOPPER90}; shift ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift ;;
    --force) force=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build_kokkos_cuda.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$arch" in
  KEPLER*|MAXWELL*|PASCAL*|VOLTA*|TURING*|AMPERE*|HOPPER90) ;;
  *) echo "build_kokkos_cuda.sh: --arch '$arch' is not an NVIDIA Kokkos arch option" \
          "(allowed: HOPPER90, AMPERE80, AMPERE86, TURING75, VOLTA70, ...)" >&2; exit 2 ;;
esac
case "$jobs" in ''|*[!0-9]*) echo "build_kokkos_cuda.sh: --jobs '$jobs' is not a number" >&2; exit 2 ;; esac

version=3.4.01
sdist=pykokkos-base==0.0.7
patch_file="$repo/cmake/patches/kokkos-$version-cuda13.patch"
cuda_home=${CUDA_HOME:-/usr/local/cuda}
[ -n "$prefix" ] || prefix="$repo/.deps/kokkos-$backend"
case "$prefix" in /*) ;; *) prefix="$PWD/$prefix" ;; esac
tag="[kokkos-$backend]"

patch_hash=$(sha256sum "$patch_file" | cut -c1-16)
if [ "$backend" = cuda ]; then
  [ -x "$cuda_home/bin/nvcc" ] || { echo "build_kokkos_cuda.sh: no nvcc in $cuda_home/bin" \
                                         "(set CUDA_HOME)" >&2; exit 1; }
  stamp_want="kokkos=$version patch=$patch_hash arch=$arch cuda=$("$cuda_home/bin/nvcc" --version |
    sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  installed="$prefix/bin/nvcc_wrapper"
else
  stamp_want="kokkos=$version patch=$patch_hash backend=openmp cxx=$(${CXX:-g++} -dumpfullversion)"
  installed="$prefix/include/Kokkos_Core.hpp"
fi
stamp="$prefix/.colossal-stamp"
if [ "$force" = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_want" ] &&
   [ -e "$installed" ]; then
  echo "$tag up to date in $prefix ($stamp_want)"
  exit 0
fi

work="$repo/.deps/src"
mkdir -p "$work"
tarball=$(ls "$work"/pykokkos-base-0.0.7.tar.gz 2>/dev/null || true)
if [ -z "$tarball" ]; then
  echo "$tag downloading $sdist (sdist) from PyPI"
  # --no-binary for this package only: ':all:' would build CMake from source for ten minutes.
  python3 -m pip download -q --no-deps --no-binary pykokkos-base "$sdist" -d "$work"
  tarball="$work/pykokkos-base-0.0.7.tar.gz"
fi
src="$work/kokkos-$version"
rm -rf "$src" "$work/pykokkos-base-0.0.7"
tar -xzf "$tarball" -C "$work" pykokkos-base-0.0.7/external/kokkos
mv "$work/pykokkos-base-0.0.7/external/kokkos" "$src"
rm -rf "$work/pykokkos-base-0.0.7" "$src/build"   # the sdist carries a stray configured build/
echo "$tag patching with ${patch_file#"$repo"/}"
patch -s -p1 -d "$src" < "$patch_file"

build="$work/kokkos-build-$backend"
rm -rf "$build" "$prefix"
if [ "$backend" = cuda ]; then
  echo "$tag configuring (Serial + OpenMP + CUDA, arch $arch, C++20, shared)"
  backend_flags=(-DCMAKE_CXX_COMPILER="$src/bin/nvcc_wrapper" -DKokkos_ENABLE_CUDA=ON
                 -DKokkos_ENABLE_CUDA_LAMBDA=ON -DKokkos_ARCH_"$arch"=ON)
else
  echo "$tag configuring (Serial + OpenMP, C++20, shared)"
  backend_flags=()
fi
# ccache in front of nvcc_wrapper does not help a one-off build and confuses its argument parsing.
env -u CMAKE_CXX_COMPILER_LAUNCHER -u CMAKE_C_COMPILER_LAUNCHER CUDA_HOME="$cuda_home" \
  NVCC_WRAPPER_DEFAULT_COMPILER=${NVCC_WRAPPER_DEFAULT_COMPILER:-g++} \
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=20 \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=ON \
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON "${backend_flags[@]}" \
    -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF > "$work/kokkos-configure.log" 2>&1 ||
  { tail -40 "$work/kokkos-configure.log" >&2; exit 1; }
echo "$tag building ($jobs jobs)"
env -u CMAKE_CXX_COMPILER_LAUNCHER CUDA_HOME="$cuda_home" \
  cmake --build "$build" -j "$jobs" > "$work/kokkos-build.log" 2>&1 ||
  { grep -m20 -B2 -A5 "error" "$work/kokkos-build.log" >&2 || tail -40 "$work/kokkos-build.log" >&2
    exit 1; }
cmake --install "$build" > "$work/kokkos-install.log" 2>&1 ||
  { tail -20 "$work/kokkos-install.log" >&2; exit 1; }
echo "$stamp_want" > "$stamp"
echo "$tag installed into $prefix ($(du -sh "$prefix" | cut -f1))"
