#!/usr/bin/env bash
# The Slurm scripts submitted to a real Slurm cluster (ctest label "slurm"):
#   test_slurm.sh train     sbatch -n 2 slurm/train.sbatch (srun, data parallel 2): its per-step
#                           losses equal those of the same config under mpirun -np 2
#   test_slurm.sh sweep     a YAML grid sweep of 3 points as a job array (slurm/sweep.sbatch), and
#                           colossal_sweep summarize's table of 3 rows
#   test_slurm.sh preempt   scancel --signal=USR1 mid-run: the job checkpoints, exits 0, requeues
#                           itself, resumes, and ends with the per-step losses of an uninterrupted
#                           run
# The cluster is the one slurm/local-cluster.sh started (found through its state directory), or,
# with COLOSSAL_TEST_SLURM=1, whatever cluster Slurm's commands reach (COLOSSAL_TEST_SBATCH_ARGS
# adds e.g. "--partition=debug --account=me"). Without one the test exits 77, which ctest reports
# as skipped (with COLOSSAL_REQUIRE_SLURM=1, as in CI, it fails instead). Every wait is bounded;
# jobs still queued when the test ends are cancelled.
set -euo pipefail

case_name="${1:?usage: test_slurm.sh train|sweep|preempt}"
src="${COLOSSAL_SOURCE_DIR:?run through ctest (COLOSSAL_SOURCE_DIR)}"
bin="${COLOSSAL_BIN_DIR:?run through ctest (COLOSSAL_BIN_DIR)}"
wait_s="${COLOSSAL_TEST_SLURM_WAIT:-180}"  # per job; a requeue waits out the credential lifetime

# No cluster: skipped (exit 77), or a failure where one is required (CI sets COLOSSAL_REQUIRE_SLURM=1).
skip() {
  if [ "${COLOSSAL_REQUIRE_SLURM:-0}" = 1 ]; then echo "FAIL: $* (COLOSSAL_REQUIRE_SLURM=1)" >&2; exit 1; fi
  echo "SKIP: $*"
  exit 77
}
fail() { echo "FAIL: $*" >&2; exit 1; }

if [ "${COLOSSAL_TEST_SLURM:-0}" != 1 ]; then
  status=$("$src/slurm/local-cluster.sh" status 2>&1) ||
    skip "no Slurm cluster running (start one with: slurm/local-cluster.sh start)"
  eval "$("$src/slurm/local-cluster.sh" env)"
  export SLURM_CONF
fi
command -v sbatch > /dev/null || skip "no Slurm cluster running (sbatch is not installed)"
timeout 10 sinfo --noheader > /dev/null 2>&1 || skip "no Slurm cluster running (sinfo gets no answer)"
read -r -a site_args <<< "${COLOSSAL_TEST_SBATCH_ARGS:-}"

work="$PWD/slurm-test-$case_name"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export COLOSSAL_ROOT="$src" COLOSSAL_BIN="$bin/colossal_train" OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset COLOSSAL_LAUNCH COLOSSAL_RUN_DIR COLOSSAL_SWEEP_DIR SLURM_JOB_ID SLURM_JOBID

jobs=()
cleanup() {
  local j
  for j in "${jobs[@]}"; do scancel "$j" 2> /dev/null || true; done
}
trap cleanup EXIT

# A tiny model on a tiny corpus: each run takes seconds.
for i in $(seq 200); do echo "the quick brown fox $i jumps over the lazy dog."; done > data.txt
cat > tiny.yaml << EOF
model: {layers: 2, hidden: 32, heads: 2, vocab: 256, max_seq: 16}
data: {path: $work/data.txt, val_path: $work/data.txt, val_windows: 4}
train: {steps: 6, seq_len: 16, global_batch: 8, micro_batch: 2}
eval: {every: 3}
log: {every: 1, dir: $work/unused}
EOF

submit() {
  local id
  id=$(sbatch --parsable --chdir="$work" --time=10 "${site_args[@]}" "$@") ||
    fail "sbatch $* failed"
  id="${id%%;*}"
  jobs+=("$id")
  echo "$id"
}

# `scontrol show job` lines of a job (every task of an array), one per line.
job_lines() { scontrol --oneliner show job "$1" 2> /dev/null || true; }
field() { grep -o "$1=[^ ]*" | cut -d= -f2-; }

# Waits until every task of job $1 has ended; fails unless all COMPLETED with exit code 0.
wait_job() {
  local id=$1 deadline=$((SECONDS + ${2:-$wait_s})) lines states
  while :; do
    lines=$(job_lines "$id")
    states=$(field JobState <<< "$lines" | sort -u | tr '\n' ' ')
    case "$states" in
      "" | *PENDING* | *RUNNING* | *CONFIGURING* | *COMPLETING* | *REQUEUE* | *SUSPENDED* | *RESIZING*) ;;
      *) break ;;
    esac
    [ $SECONDS -lt $deadline ] || { echo "$lines" >&2; fail "job $id still '$states' after ${2:-$wait_s} s"; }
    sleep 1
  done
  if [ "$states" != "COMPLETED " ] || grep -q "ExitCode=[^0]" <<< "$lines" ||
    grep -q "ExitCode=0:[^0]" <<< "$lines"; then
    echo "$lines" >&2
    cat "$work"/slurm-*"$id"*.out >&2 2> /dev/null || true
    fail "job $id ended '$states'"
  fi
}

# The loss column (2) of a metrics.csv, one value per step.
losses() { awk -F, 'NR > 1 { print $1, $2 }' "$1"; }

# Compares the per-step losses of two metrics files: the same steps, each loss within 1e-6.
same_losses() {
  local a=$1 b=$2
  [ -s "$a" ] || fail "$a is missing or empty"
  [ -s "$b" ] || fail "$b is missing or empty"
  if ! paste -d' ' <(losses "$a") <(losses "$b") | awk -v a="$a" -v b="$b" '
      { n++
        if ($1 != $3) { printf "row %d: step %s in %s, step %s in %s\n", n, $1, a, $3, b; bad = 1 }
        d = $2 - $4; if (d < 0) d = -d
        if (d > 1e-6) { printf "step %s: loss %s in %s, %s in %s\n", $1, $2, a, $4, b; bad = 1 } }
      END { if (n == 0) { print "no steps"; bad = 1 }; exit bad }'; then
    fail "per-step losses differ between $a and $b"
  fi
  [ "$(wc -l < "$a")" = "$(wc -l < "$b")" ] || fail "$a and $b have different numbers of rows"
  echo "same per-step losses: $a and $b ($(($(wc -l < "$a") - 1)) steps)"
}

reference() {  # reference DIR ARGS...: the same run under mpirun -np 2, outside Slurm
  local dir=$1
  shift
  timeout 120 env -u SLURM_CONF mpirun -np 2 --oversubscribe "$bin/colossal_train" "$work/tiny.yaml" \
    --set "log.dir=$dir" "$@" > "$dir.out" 2>&1 || { cat "$dir.out" >&2; fail "mpirun reference failed"; }
}

case "$case_name" in
  train)
    # (1) srun -n 2 under sbatch against mpirun -np 2: identical per-step losses.
    id=$(submit --ntasks=2 --ntasks-per-node=2 --nodes=1 --cpus-per-task=1 --job-name=parity \
      "$src/slurm/train.sbatch" "$work/tiny.yaml" --set parallel.data=2)
    wait_job "$id"
    out="$work/slurm-parity-$id.out"
    run="$work/runs/parity-$id"
    cat "$out"
    [ -f "$run/model.h5" ] || fail "no model.h5 in $run (the run directory is named by the job id)"
    grep -q "slurm: job $id 'parity', step 0" "$out" || fail "colossal_train did not report the Slurm job and step"
    grep -q "task 0 of 2, local id 0" "$out" || fail "colossal_train did not report 2 tasks"
    grep -q "local rank 0 (SLURM_LOCALID)" "$out" || fail "the local rank did not come from SLURM_LOCALID"
    reference "$work/ref" --set parallel.data=2
    same_losses "$run/metrics.csv" "$work/ref/metrics.csv"
    ;;
  sweep)
    # (2) a 3-point grid as a job array; the summary has one row per point.
    cat > grid.yaml << EOF
base: $work/tiny.yaml
set: {train.steps: 4, eval.every: 2}
grid:
  train.optimizer.lr: [1.0e-3, 2.0e-3, 4.0e-3]
EOF
    n=$("$bin/colossal_sweep" count grid.yaml)
    [ "$n" = 3 ] || fail "colossal_sweep count grid.yaml printed '$n', not 3"
    id=$(submit --array=0-$((n - 1)) --ntasks=1 --cpus-per-task=1 "$src/slurm/sweep.sbatch" "$work/grid.yaml")
    wait_job "$id"
    cat "$work"/slurm-colossal-sweep-"$id"_*.out
    "$bin/colossal_sweep" summarize "$work/runs/grid-$id"
    summary="$work/runs/grid-$id/summary.csv"
    [ "$(head -n 1 "$summary")" = "run,overrides,steps,final_loss,best_val_loss,best_choices_accuracy,tokens_per_s,finished" ] ||
      fail "unexpected header in $summary"
    [ "$(tail -n +2 "$summary" | wc -l)" = 3 ] || fail "$summary does not have 3 rows"
    lrs=(1.0e-3 2.0e-3 4.0e-3)
    for i in 0 1 2; do
      lr=${lrs[$i]}
      grep -q "^$i,\"\{0,1\}train.steps=4 eval.every=2 train.optimizer.lr=$lr\"\{0,1\},4,[0-9.]*,[0-9.]*,[0-9.]*,[0-9]*,yes$" "$summary" ||
        fail "no finished row for point $i (lr $lr) in $summary"
    done
    echo "3 points, 3 rows in $summary"
    ;;
  preempt)
    # (3) USR1 mid-run: checkpoint, exit 0, requeue (by the script), resume, same losses.
    steps=400
    args=(--set parallel.data=2 --set "train.steps=$steps" --set checkpoint.every=1
          --set eval.every=0 --set log.every=50)
    id=$(submit --ntasks=2 --ntasks-per-node=2 --nodes=1 --cpus-per-task=1 --job-name=preempt \
      "$src/slurm/train.sbatch" "$work/tiny.yaml" "${args[@]}")
    run="$work/runs/preempt-$id"
    deadline=$((SECONDS + wait_s))
    until [ "$(wc -l < "$run/metrics.csv" 2> /dev/null || echo 0)" -gt 5 ]; do
      [ $SECONDS -lt $deadline ] || fail "job $id wrote no steps in $wait_s s"
      sleep 0.1
    done
    scancel --signal=USR1 "$id"
    echo "sent USR1 to job $id after $(($(wc -l < "$run/metrics.csv") - 1)) steps"
    wait_job "$id"
    out="$work/slurm-preempt-$id.out"
    cat "$out"
    grep -q "stopped at step" "$out" || fail "the run did not stop on SIGUSR1 (it may have finished first)"
    grep -q "requeueing job $id" "$out" || fail "train.sbatch did not requeue the job"
    grep -q "resumed from $run/checkpoints/ckpt-" "$out" || fail "the requeued job did not resume"
    restarts=$(job_lines "$id" | field Restarts)
    [ "${restarts:-0}" -ge 1 ] || fail "Slurm counts ${restarts:-0} restarts of job $id"
    [ -f "$run/model.h5" ] || fail "the resumed run did not finish ($run/model.h5)"
    [ "$(cat "$run/finished" 2> /dev/null)" = "step $(awk -F, 'END { print $1 }' "$run/metrics.csv")" ] ||
      fail "the resumed run wrote no log.dir/finished for its last step"
    reference "$work/ref" "${args[@]}"
    same_losses "$run/metrics.csv" "$work/ref/metrics.csv"
    ;;
  *) fail "unknown case '$case_name' (train, sweep, preempt)" ;;
esac
echo "PASS: slurm $case_name"
