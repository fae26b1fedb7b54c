#!/usr/bin/env python3
"""model.init_from against Hugging Face transformers (docs/init-from.md).

For GPT-2, OPT and LLaMA: builds GPT2LMHeadModel / OPTForCausalLM / LlamaForCausalLM (grouped-
query attention, untied head; and a Llama 3.2-like one: tied head, rope_scaling of rope_type
llama3 with an original context of 16 positions, so that the scaling moves the frequencies the
64-token windows reach) from a small config with random weights, save_pretrained()s it to a
temporary directory (OPT sharded with an index), then runs
  colossal_eval     with model: {preset: from_weights, init_from: DIR}
  colossal_generate with the same config, --temperature 0
  colossal_eval     --choices FILE --choices-out CSV (FILE: scripts/make_choices.py text)
and checks that our validation loss over the quickstart validation text equals transformers'
(fp32, the same windows: x = tokens[i*T : i*T+T], y shifted by one, i < (N-1)//T, capped by
data.val_windows) to 1e-5 relative, that our greedy continuation of a prompt is
transformers' argmax continuation token for token, and that each multiple-choice completion's
summed cross-entropy after its context is transformers' to 1e-5 relative.

Exit 0: pass; 1: a mismatch; 77: skipped (torch or transformers not importable: they are never
a build dependency); 2: a tool failed. ctest registers it as `hf_reference` (SKIP_RETURN_CODE 77).
  python3 tests/python/test_hf_reference.py --bin-dir build/bin --source-dir .
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77
SEQ_LEN, VAL_WINDOWS, PROMPT, NEW_TOKENS = 64, 16, "This License", 24


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except Exception as e:  # ImportError, or a torch whose shared libraries are missing
        print(f"SKIP: torch and transformers are needed for this reference test ({e})")
        return SKIP
    torch.set_grad_enabled(False)
    torch.manual_seed(1234)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")

    train = os.path.join(args.source_dir, "data", "licenses_train.txt")
    val = os.path.join(args.source_dir, "data", "licenses_val.txt")
    if not os.path.exists(val):
        print(f"error: {val} is missing; run scripts/prepare_data.sh first")
        return 2
    tokens = list(open(val, "rb").read())
    windows = min((len(tokens) - 1) // SEQ_LEN, VAL_WINDOWS)
    x = torch.tensor([tokens[i * SEQ_LEN:(i + 1) * SEQ_LEN] for i in range(windows)])
    y = torch.tensor([tokens[i * SEQ_LEN + 1:(i + 1) * SEQ_LEN + 1] for i in range(windows)])

    cases = {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4, n_inner=256,
            activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.1, bos_token_id=0,
            eos_token_id=0)),
        "opt": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
            vocab_size=256, hidden_size=64, num_hidden_layers=2, ffn_dim=256,
            num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=64,
            do_layer_norm_before=True, activation_function="relu", dropout=0.0,
            attention_dropout=0.0, init_std=0.1)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=160, max_position_embeddings=128,
            rms_norm_eps=1e-6, rope_theta=500.0, tie_word_embeddings=False, hidden_act="silu",
            attention_bias=False, mlp_bias=False, initializer_range=0.1)),
        "llama3": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=160, max_position_embeddings=128,
            rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
            hidden_act="silu", attention_bias=False, mlp_bias=False, initializer_range=0.1,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    }
    failed = False
    with tempfile.TemporaryDirectory(prefix="colossal_hf_") as tmp:
        # 12 multiple-choice examples from the validation text: 40 bytes of context, 4
        # completions of 8 bytes; their rows as llm.c's format stores them.
        choices = os.path.join(tmp, "choices.bin")
        r = subprocess.run([sys.executable, os.path.join(args.source_dir, "scripts",
                                                         "make_choices.py"),
                            "text", val, "--out", choices, "--examples", "12", "--context", "40",
                            "--completion", "8", "--seed", "3"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"error: make_choices.py failed ({r.returncode}):\n{r.stdout}{r.stderr}")
            return 2
        examples = read_choices(choices, args.source_dir)
        for arch, build in cases.items():
            model = build().eval()
            # Random biases and layernorm weights too, so every tensor's mapping matters.
            for name, p in model.named_parameters():
                if name.endswith("bias") or "norm" in name or name.startswith("transformer.ln"):
                    p.copy_(torch.randn_like(p) * 0.1 + (1.0 if name.endswith("weight") else 0.0))
            out = os.path.join(tmp, arch)
            # OPT in shards (model.safetensors.index.json), GPT-2 in one file.
            model.save_pretrained(out, max_shard_size="100KB" if arch == "opt" else "5GB")
            files = sorted(os.listdir(out))
            logits = model(x).logits.float()
            ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).item()
            ref64 = torch.nn.functional.cross_entropy(
                logits.double().reshape(-1, 256), y.reshape(-1)).item()

            cfg = os.path.join(tmp, arch + ".yaml")
            with open(cfg, "w") as f:
                f.write(f"model: {{preset: from_weights, init_from: {out}}}\n"
                        f"data: {{path: {train}, val_path: {val}, val_windows: {VAL_WINDOWS}}}\n"
                        f"train: {{seq_len: {SEQ_LEN}, global_batch: 4, micro_batch: 4}}\n"
                        f"log: {{dir: {os.path.join(tmp, arch + '_run')}}}\n")
            r = subprocess.run([os.path.join(args.bin_dir, "colossal_eval"), cfg],
                               capture_output=True, text=True)
            m = re.search(r"val loss \S+ \(([-+0-9.eE]+)\)", r.stdout)
            if r.returncode != 0 or not m:
                print(f"error: colossal_eval failed ({r.returncode}):\n{r.stdout}{r.stderr}")
                return 2
            ours = float(m.group(1))
            rel = abs(ours - ref) / abs(ref)
            ok = rel <= 1e-5
            failed |= not ok
            print(f"{arch}: saved {', '.join(files)}")
            print(f"{arch}: val loss ours {ours:.9g}, transformers {ref:.9g} "
                  f"(log-softmax in fp64: {ref64:.9g}); relative difference {rel:.2e} "
                  f"{'ok' if ok else 'FAIL (> 1e-5)'}")

            ids = list(PROMPT.encode())
            for _ in range(NEW_TOKENS):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            want = bytes(ids[len(PROMPT):])
            r = subprocess.run([os.path.join(args.bin_dir, "colossal_generate"), cfg,
                                "--prompt", PROMPT, "--tokens", str(NEW_TOKENS),
                                "--temperature", "0"], capture_output=True)
            if r.returncode != 0:
                print(f"error: colossal_generate failed ({r.returncode}):\n"
                      f"{r.stdout.decode(errors='replace')}{r.stderr.decode(errors='replace')}")
                return 2
            got = r.stdout[len(PROMPT):len(PROMPT) + NEW_TOKENS]
            same = got == want
            failed |= not same
            print(f"{arch}: greedy {NEW_TOKENS} tokens ours {list(got)}\n"
                  f"{' ' * len(arch)}  transformers      {list(want)} "
                  f"{'equal' if same else 'FAIL (differ)'}")

            # Multiple-choice scores: each completion's summed loss after its context.
            rows_csv = os.path.join(tmp, arch + "_choices.csv")
            r = subprocess.run([os.path.join(args.bin_dir, "colossal_eval"), cfg, "--choices",
                                choices, "--choices-out", rows_csv],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"error: colossal_eval --choices failed ({r.returncode}):\n"
                      f"{r.stdout}{r.stderr}")
                return 2
            with open(rows_csv) as f:
                ours_rows = [line.split(",") for line in f.read().split("\n")[1:] if line]
            worst, k = 0.0, 0
            for context, completions in examples:
                for completion in completions:
                    seq = context + completion
                    logp = torch.log_softmax(model(torch.tensor([seq[:-1]])).logits[0].double(),
                                             -1)
                    want = -sum(logp[len(context) - 1 + j, t].item()
                                for j, t in enumerate(completion))
                    worst = max(worst, abs(float(ours_rows[k][5]) - want) / abs(want))
                    k += 1
            ok = k == len(ours_rows) and worst <= 1e-5
            failed |= not ok
            print(f"{arch}: {k} multiple-choice completions, largest relative difference of "
                  f"their losses {worst:.2e} {'ok' if ok else 'FAIL (> 1e-5)'}")
    return 1 if failed else 0


def read_choices(path, source_dir):
    """[(context, [completion, ...])] through scripts/make_choices.py's reader."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "make_choices", os.path.join(source_dir, "scripts", "make_choices.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(context, completions) for _, _, context, completions in module.read_file(path)]


if __name__ == "__main__":
    sys.exit(main())
