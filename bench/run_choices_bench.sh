#!/usr/bin/env bash
# Multiple-choice scoring speed: colossal_eval --choices (train.micro_batch completions per
# forward, in the shortest window that holds every row) against Hugging Face transformers
# scoring the same file with the same weights (bench/choices_peer.py: each example's
# completions as one right-padded batch), in one run: completions/s, accuracy, the ratio and the
# largest relative difference of the completions' losses. The model file is written by one
# training step of CONFIG and exported with colossal_export for the peer; the file holds
# byte-level continuation questions from data/licenses_val.txt (scripts/make_choices.py text:
# 64 tokens of context, 4 completions of 16). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset
# for every program, which all run on the first --threads cores.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: bench/run_choices_bench.sh [--examples N] [--threads N] [--config YAML] [--peer ENV_SH]
  --examples N    examples of 4 completions (default 48)
  --threads N     cores of every program (default: all of them)
  --config YAML   the model (default configs/gpt2-124m.yaml)
  --peer ENV_SH   also run transformers: ENV_SH activates a venv with torch and transformers
USAGE
}
examples=48
threads=$(nproc)
config="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/configs/gpt2-124m.yaml"
peer_env=""
while [ $# -gt 0 ]; do
  case "$1" in
    --examples) examples="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --config) config="$2"; shift ;;
    --peer) peer_env="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_choices_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ -f "$config" ] || { echo "run_choices_bench.sh: no config '$config'" >&2; exit 2; }
config="$(cd "$(dirname "$config")" && pwd)/$(basename "$config")"  # common.sh changes directory
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
pin=(taskset -c "0-$((threads - 1))")
echo "# $(cpu_line); $threads threads; $examples examples x 4 completions of 16 tokens after 64"
# The peer keeps whole contexts: the rows (64 + 16 tokens) must fit the config's window, as
# they do in colossal_eval (which would cut the contexts otherwise).
seq_len=$("$train" "$config" --print-config | sed -n 's/^  seq_len: *//p')
[ "${seq_len:-0}" -ge 80 ] || { echo "run_choices_bench.sh: train.seq_len of $config is" \
  "${seq_len:-unknown}; the benchmark's rows need 80" >&2; exit 2; }
model_file "$config" "$work/run"
python3 scripts/make_choices.py text data/licenses_val.txt --out "$work/choices.bin" \
  --examples "$examples" --context 64 --completion 16 --choices 4 > /dev/null
peer "${pin[@]}" "$root/build/bin/colossal_eval" "$config" --weights "$work/run/model.h5" \
  --set data.val_path= --choices "$work/choices.bin" --choices-out "$work/ours.csv" \
  > "$work/eval.out" 2> "$work/eval.err" || { cat "$work/eval.out" "$work/eval.err" >&2; exit 1; }
# completions over the scoring's own seconds (its output line), not the model's loading
ours_rate=$(awk '/^choices .*completions, .* s$/ && $(NF-1) > 0 {printf "%.3f", $(NF-3) / $(NF-1)}' \
  "$work/eval.out")
[ -n "$ours_rate" ] || { echo "run_choices_bench.sh: no timing line in colossal_eval's output" >&2
                         cat "$work/eval.out" >&2; exit 1; }
ours_acc=$(sed -n 's/^choices accuracy \([0-9.]*\) .*/\1/p' "$work/eval.out")
window=$(sed -n 's/^choices: scored in a window of \([0-9]*\) .*/\1/p' "$work/eval.out")
peer_rate="-"
peer_acc="-"
gap="-"
if [ -n "$peer_env" ]; then
  # shellcheck disable=SC1090
  source "$peer_env"
  "$root/build/bin/colossal_export" "$work/run/model.h5" --out "$work/hf" > /dev/null
  peer OMP_NUM_THREADS="$threads" "${pin[@]}" python3 "$root/bench/choices_peer.py" \
    --model "$work/hf" --choices "$work/choices.bin" --threads "$threads" \
    --csv "$work/peer.csv" > "$work/peer.out"
  peer_rate=$(sed -n 's/^completions_per_s=//p' "$work/peer.out")
  peer_acc=$(sed -n 's/^accuracy_per_token=//p' "$work/peer.out")
  rows=$(($(wc -l < "$work/ours.csv") - 1))
  [ "$rows" = "$(wc -l < "$work/peer.csv")" ] || {
    echo "run_choices_bench.sh: colossal_eval scored $rows completions, the peer" \
         "$(wc -l < "$work/peer.csv")" >&2; exit 1; }
  gap=$(tail -n +2 "$work/ours.csv" | cut -d, -f6 | paste -d, - "$work/peer.csv" |
        awk -F, '{d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d} END {printf "%.2g", m}')
fi
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b == "-" || b == 0) print "-"; else printf "%.2fx", a / b }'; }
printf '| %-46s | %13s | %18s | %15s |\n' "program" "completions/s" "accuracy per token" "vs transformers"
printf '|%s|%s|%s|%s|\n' "------------------------------------------------" "---------------" \
  "--------------------" "-----------------"
printf '| %-46s | %13s | %18s | %15s |\n' "colossal_eval --choices (window ${window:-as config})" \
  "$ours_rate" "$ours_acc" "$(ratio "$ours_rate" "$peer_rate")"
printf '| %-46s | %13s | %18s | %15s |\n' "transformers, one batch per example" "$peer_rate" \
  "$peer_acc" "1.00x"
echo "# largest relative difference of the completions' losses: $gap"
