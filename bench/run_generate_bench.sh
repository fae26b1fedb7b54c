#!/usr/bin/env bash
# Sampling speed: colossal_generate with its KV cache and with --no-cache (every token a forward
# over the train.seq_len window) against Hugging Face transformers' greedy generate() of the same
# GPT-2 shape with and without its cache (bench/generate_peer.py), in one run, tokens/s and
# ratios. The model file is written by one training step of CONFIG (the weights do not change
# the speed); the peer's model is built from a config. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are
# unset for every program, which all run on the first --threads cores (taskset: colossal takes
# as many threads as its usable cores, the peer --threads torch threads).
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: bench/run_generate_bench.sh [--tokens N] [--threads N] [--config YAML] [--peer ENV_SH]
  --tokens N      tokens generated per run (default 100; with the 3-byte prompt, keep
                  N + 3 <= train.seq_len so that every token comes from the cache)
  --threads N     cores of every program (default: all of them)
  --config YAML   the model and window (default configs/gpt2-124m.yaml: T=256)
  --peer ENV_SH   also run transformers: ENV_SH activates a venv with torch and transformers
                  (bench/make_torch_venv.sh DIR, then pip install transformers in it)
USAGE
}
tokens=100
threads=$(nproc)
config="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/configs/gpt2-124m.yaml"
peer_env=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) tokens="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --config) config="$2"; shift ;;
    --peer) peer_env="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_generate_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ -f "$config" ] || { echo "run_generate_bench.sh: no config '$config'" >&2; exit 2; }
config="$(cd "$(dirname "$config")" && pwd)/$(basename "$config")"  # common.sh changes directory
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
generate="$root/build/bin/colossal_generate"
pin=(taskset -c "0-$((threads - 1))")
echo "# $(cpu_line); $threads threads; $tokens tokens after a 3-token prompt, greedy"
model_file "$config" "$work/run"
rate() {  # the tokens/s of colossal_generate's summary line
  sed -n 's/.*colossal_generate: .* (\([0-9.]*\) tokens\/s;.*/\1/p' "$1"
}
ours() {
  peer "${pin[@]}" "$generate" "$config" --weights "$work/run/model.h5" --prompt The --tokens "$tokens" \
    --temperature 0 "$@" > "$work/gen.out" 2> "$work/gen.err" || { cat "$work/gen.err" >&2; exit 1; }
  rate "$work/gen.err"
}
cached=$(ours)
uncached=$(ours --no-cache)
hf_cached="-"
hf_uncached="-"
if [ -n "$peer_env" ]; then
  # shellcheck disable=SC1090
  source "$peer_env"
  model=$(sed -n 's/^ *preset: *//p' "$config")
  [ "$model" = gpt2-124m ] || echo "# note: the peer runs GPT-2 small's shape" >&2
  run_peer() {
    peer OMP_NUM_THREADS="$threads" "${pin[@]}" python3 "$root/bench/generate_peer.py" --tokens "$tokens" \
      --prompt-tokens 3 --threads "$threads" "$@" | sed -n 's/^tokens_per_s=//p'
  }
  hf_cached=$(run_peer)
  hf_uncached=$(run_peer --no-cache)
fi
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b == "-" || b == 0) print "-"; else printf "%.2fx", a / b }'; }
printf '| %-44s | %10s | %18s |\n' "program" "tokens/s" "vs transformers"
printf '|%s|%s|%s|\n' "----------------------------------------------" "------------" "--------------------"
printf '| %-44s | %10s | %18s |\n' "colossal_generate (KV cache)" "$cached" "$(ratio "$cached" "$hf_cached")"
printf '| %-44s | %10s | %18s |\n' "colossal_generate --no-cache (whole window)" "$uncached" "$(ratio "$uncached" "$hf_uncached")"
printf '| %-44s | %10s | %18s |\n' "transformers generate (use_cache=True)" "$hf_cached" "1.00x"
printf '| %-44s | %10s | %18s |\n' "transformers generate (use_cache=False)" "$hf_uncached" "-"
echo "# the KV cache is $(ratio "$cached" "$uncached") --no-cache's speed"
