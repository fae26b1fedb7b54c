#!/usr/bin/env bash
# The device kernels' team forms (core/*_team.hpp) with real thread teams on the CPU: Debian's
# Kokkos is Serial, whose teams have one thread, so a missing team_barrier or a race between a
# team's threads or vector lanes passes there. This builds Kokkos 3.4.01 with OpenMP
# (scripts/build_kokkos_cuda.sh --openmp, into .deps/kokkos-openmp; a few minutes, once), the
# `openmp` preset's test_kernels_team (build-openmp/), and runs it with teams of 2, 4 and 8
# threads (COLOSSAL_TEAM_SIZE; 8 threads on 2 cores take about a minute) and with Kokkos'
# own team size; and test_optimizer, whose AdamW takes the device's fused update
# (team::adamw_update) wherever Kokkos' threads are not Serial. CI runs it after the CUDA
# compile check.
#
#   scripts/check_team_kernels.sh [--jobs N]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
case "${1:-}" in
  --jobs) jobs=${2:?--jobs needs a number} ;;
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "check_team_kernels.sh: unknown argument '$1'" >&2; exit 2 ;;
esac
scripts/build_kokkos_cuda.sh --openmp --jobs "$jobs"
cmake --preset openmp > /dev/null
cmake --build --preset openmp-teams -j "$jobs" 2>&1 | tail -n 3
test "${PIPESTATUS[0]}" = 0
fail=0
for team in 2 4 8 auto; do
  threads=$team
  [ "$team" = auto ] && threads=4
  t0=$SECONDS
  if [ "$team" = auto ]; then
    env OMP_NUM_THREADS="$threads" OMP_PROC_BIND=false build-openmp/bin/test_kernels_team \
      > "build-openmp/team-$team.log" 2>&1 || fail=1
  else
    env OMP_NUM_THREADS="$threads" OMP_PROC_BIND=false COLOSSAL_TEAM_SIZE="$team" \
      build-openmp/bin/test_kernels_team > "build-openmp/team-$team.log" 2>&1 || fail=1
  fi
  echo "[teams] $threads OpenMP threads, team size $team: $(grep -E '^\[  (PASSED|FAILED)' \
    "build-openmp/team-$team.log" | head -1 | tr -s ' ') ($((SECONDS - t0)) s)"
done
t0=$SECONDS
OMP_NUM_THREADS=4 OMP_PROC_BIND=false build-openmp/bin/test_optimizer \
  > build-openmp/optimizer.log 2>&1 || fail=1
echo "[teams] test_optimizer (the fused AdamW) on 4 OpenMP threads: $(grep -E \
  '^\[  (PASSED|FAILED)' build-openmp/optimizer.log | head -1 | tr -s ' ') ($((SECONDS - t0)) s)"
if [ "$fail" != 0 ]; then
  grep -h -E 'FAILED|Failure|Expected|Which is' build-openmp/team-*.log build-openmp/optimizer.log | head -40 >&2
  exit 1
fi
