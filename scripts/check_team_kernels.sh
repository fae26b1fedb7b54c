#!/usr/bin/env bash
# The device kernels' team forms (core/*_team.hpp) with real thread teams on the CPU: Debian's
# Kokkos is Serial, whose teams have one thread, so a missing team_barrier or a race between a
# team's threads or vector lanes passes there. This builds Kokkos 3.4.01 with OpenMP
# (scripts/build_kokkos_cuda.sh --openmp, into .deps/kokkos-openmp; a few minutes, once) and
# the `openmp` preset (build-openmp/, COLOSSAL_HOST_TEAM_KERNELS=ON: every kernel takes its
# device form on the host too), then runs
#   1. test_kernels_team with teams of 2, 4 and 8 threads (COLOSSAL_TEAM_SIZE; at 8, two slow
#      cases are left out) and with Kokkos' own team size, and test_optimizer, whose
#      AdamW takes the device's fused update (team::adamw_update) wherever Kokkos' threads are
#      not Serial;
#   2. the model through the device forms, as a GPU runs it: test_kernels, test_model_grad,
#      test_llama_kernels, test_llama_model and test_decode on teams of 2 threads (gradients
#      against finite differences, decoding against the forward), and the layouts' parity
#      with one rank: data parallelism and ZeRO (the fused AdamW on shards; again with
#      COLOSSAL_DEFER_COPIES=1), tensor and sequence parallelism
#      (test_tensor_parallel: the vocabulary-parallel cross-entropy, ring attention, LLaMA,
#      bf16), pipelines, 2D (test_tensor2d, test_model2d) on 4 ranks and 3D (test_model3d) on 8
#      (teams of one thread there: oversubscribed ranks spinning in each other's team barriers
#      take minutes per test);
#   3. 10 training steps of every model of scripts/gpu_check.sh's section 2 (GPT-2, OPT, LLaMA,
#      bf16, fused attention) by build-openmp's colossal_train on teams of 2 threads, against the
#      host build's (build/bin, which must exist: ./setup.sh) per-step losses (1e-4 relative;
#      bf16 2e-3).
# CI runs it after the CUDA compile check; on 2 cores about 4 minutes to build (Kokkos 25 s)
# and 3 to check, 2 of them the training runs.
#
#   scripts/check_team_kernels.sh [--jobs N]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
case "${1:-}" in
  --jobs) jobs=${2:?--jobs needs a number} ;;
  -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
  "") ;;
  *) echo "check_team_kernels.sh: unknown argument '$1'" >&2; exit 2 ;;
esac
[ -x build/bin/colossal_train ] ||
  { echo "check_team_kernels.sh: no build/bin/colossal_train to compare with (./setup.sh)" >&2; exit 1; }
scripts/build_kokkos_cuda.sh --openmp --jobs "$jobs"
cmake --preset openmp > /dev/null
cmake --build --preset openmp-teams -j "$jobs" 2>&1 | tail -n 3
test "${PIPESTATUS[0]}" = 0
export OMP_PROC_BIND=false OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# OpenBLAS's Haswell kernels whatever the CPU, as ctest runs the same tests
# (cmake/ColossalAddTest.cmake): the parity tolerances were set on them, and an AVX-512 CPU's
# SkylakeX kernels move a few of tp4's trained weights just past them (134 against 120 on a
# Zen 4 whose environment did not set it). COLOSSAL_TEST_OPENBLAS_CORETYPE= lets OpenBLAS choose.
export OPENBLAS_CORETYPE="${COLOSSAL_TEST_OPENBLAS_CORETYPE-Haswell}"
fail=0
logs=build-openmp/team-logs
rm -rf "$logs" && mkdir -p "$logs"
result() {  # LOG: gtest's summary line
  grep -a -E '^\[  (PASSED|FAILED)' "$1" | head -1 | tr -s ' ' || echo "no summary (crashed?)"
}
run() {  # NAME DESCRIPTION COMMAND...: runs COMMAND into $logs/NAME.log, prints one line
  local name=$1 what=$2 t0=$SECONDS
  shift 2
  "$@" --gtest_color=no > "$logs/$name.log" 2>&1 || fail=1
  echo "[teams] $what: $(result "$logs/$name.log") ($((SECONDS - t0)) s)"
}

# 1. The kernels one by one. Teams of 8 threads on 2 cores pay a context switch per barrier: there
# two cases took 55 of 70 s (the grid embedding's 16 sorted backwards and the fused attention
# backward's finite differences), and they leave that width to the embedding's sorted backward
# (EmbeddingsMatchHost..., TeamSortOrdersAnyLength) and the fused attention's forward. Teams of
# 2 and 4 and Kokkos' own size run every case.
wide_filter="-TeamKernels.GridEmbeddingBlocksMatchHostBitwise"
wide_filter+=":TeamKernels.FusedAttentionBackwardMatchesFiniteDifferences"
for team in 2 4 8; do
  filter="*" left=""
  [ "$team" = 8 ] && filter=$wide_filter left=", two slow cases left to 2 and 4"
  run "team-$team" "$team OpenMP threads, team size $team$left" \
    env OMP_NUM_THREADS="$team" COLOSSAL_TEAM_SIZE="$team" GTEST_FILTER="$filter" \
    build-openmp/bin/test_kernels_team
done
run team-auto "4 OpenMP threads, Kokkos' team size" \
  env OMP_NUM_THREADS=4 build-openmp/bin/test_kernels_team
run optimizer "test_optimizer (the fused AdamW) on 4 OpenMP threads" \
  env OMP_NUM_THREADS=4 build-openmp/bin/test_optimizer

# 2. The model through the device forms.
for t in test_kernels test_model_grad test_llama_kernels test_llama_model test_decode; do
  run "$t" "$t, every kernel in its team form, teams of 2" \
    env OMP_NUM_THREADS=2 COLOSSAL_TEAM_SIZE=2 "build-openmp/bin/$t"
done
for spec in "test_data_parallel 2" "test_tensor_parallel 4" "test_pipeline 4" "test_tensor2d 4" \
            "test_model2d 4" "test_model3d 8"; do
  read -r t ranks <<< "$spec"
  run "$t-np$ranks" "$t on $ranks ranks against one, team forms" \
    mpirun -np "$ranks" --oversubscribe -x OMP_NUM_THREADS=1 -x OMP_PROC_BIND -x OPENBLAS_CORETYPE \
    "build-openmp/bin/$t"
done
# ZeRO offload beside the fused AdamW, its copies deferred to their waits (ctest -L defer).
run test_data_parallel-np2-deferred "test_data_parallel on 2 ranks, team forms, copies deferred" \
  mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1 -x OMP_PROC_BIND -x COLOSSAL_DEFER_COPIES=1 \
  build-openmp/bin/test_data_parallel

# 3. Training runs against the host build's losses.
t0=$SECONDS
if HOST_LOSSES_DIR="$logs/losses-host" scripts/gpu_check.sh --host-losses \
     > "$logs/losses-host.log" 2>&1 &&
   HOST_BIN=build-openmp/bin HOST_LOSSES_DIR="$logs/losses-teams" OMP_NUM_THREADS=2 \
     COLOSSAL_TEAM_SIZE=2 scripts/gpu_check.sh --host-losses > "$logs/losses-teams.log" 2>&1; then
  scripts/gpu_check.sh --compare-losses "$logs/losses-host" "$logs/losses-teams" | sed 's/^/[teams] /' ||
    fail=1
else
  echo "[teams] the 10-step training runs failed: $logs/losses-*.log" >&2
  tail -n 5 "$logs"/losses-*.log >&2
  fail=1
fi
echo "[teams] training runs, team forms against the host build ($((SECONDS - t0)) s)"

if [ "$fail" != 0 ]; then
  grep -a -h -E 'FAILED|Failure|Expected|Which is' "$logs"/*.log | head -40 >&2
  exit 1
fi
