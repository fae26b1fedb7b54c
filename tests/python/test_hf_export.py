#!/usr/bin/env python3
"""The Hugging Face export, read back by the reference packages (no network, nothing downloaded).

For GPT-2, OPT and LLaMA (grouped-query, untied head): a tiny model trained by colossal_train with log.export_hf: true; every tensor
of log.dir/hf/model.safetensors, read by the `safetensors` package (numpy), bitwise equal to
model.h5's (h5py); colossal_export of the same model.h5 with a small --max-shard-size writes
shards and an index whose tensors are bitwise the same; its bad inputs are named. With torch and
transformers importable: GPT2LMHeadModel / OPTForCausalLM / LlamaForCausalLM.from_pretrained(DIR)
loads it with no
missing or unexpected weight, and its validation loss on colossal's windows equals
colossal_eval's to 1e-5 relative.

Exits 77 (skipped) when numpy, safetensors or h5py is not importable.
Environment: COLOSSAL_BIN_DIR (the programs).
"""

import json
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:
    print(f"skipped: {e.name} is not importable (needs numpy, safetensors, h5py)")
    sys.exit(77)

BIN = os.environ.get("COLOSSAL_BIN_DIR", "build/bin")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def run(args):
    return subprocess.run(args, capture_output=True, text=True)


def h5_tensors(path):
    with h5py.File(path, "r") as f:
        return {name: np.array(f[name]) for name in f.keys()
                if isinstance(f[name], h5py.Dataset)}


def bitwise_equal(a, b):
    return a.dtype == b.dtype == np.float32 and a.shape == b.shape and \
        np.array_equal(a.view(np.uint32), b.view(np.uint32))


def sharded_tensors(directory):
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(load_file(os.path.join(directory, shard)))
    return out, index


try:
    import torch
    import transformers
    torch.set_num_threads(2)
    have_torch = True
except Exception as e:  # ImportError, or a CUDA wheel that cannot load its libraries
    print(f"note: torch/transformers not usable ({e}); from_pretrained checks skipped")
    have_torch = False

with tempfile.TemporaryDirectory() as tmp:
    data = os.path.join(tmp, "data.txt")
    with open(data, "w") as f:
        f.write("Colossal exports to Hugging Face; from_pretrained loads it. " * 80)
    for arch in ["gpt2", "opt", "llama"]:
        run_dir = os.path.join(tmp, arch)
        config = os.path.join(tmp, arch + ".yaml")
        with open(config, "w") as f:
            f.write(f"model: {{arch: {arch}, layers: 2, hidden: 32, heads: 4, ffn_hidden: 48, "
                    f"vocab: 256, max_seq: 16"
                    f"{', kv_heads: 2, rope_theta: 500.0' if arch == 'llama' else ''}}}\n"
                    f"data: {{path: {data}, val_path: {data}, val_windows: 8}}\n"
                    "train: {steps: 3, seq_len: 16, global_batch: 4, micro_batch: 2,\n"
                    "        optimizer: {lr: 1.0e-2, warmup: 1}}\n"
                    f"eval: {{every: 0}}\nsample: {{tokens: 0}}\n"
                    f"log: {{every: 10, dir: {run_dir}, export_hf: true}}\n")
        r = run([os.path.join(BIN, "colossal_train"), config])
        check(r.returncode == 0, f"{arch}: colossal_train failed:\n{r.stdout}\n{r.stderr}")
        check("hugging face export: " + run_dir + "/hf" in r.stdout, f"{arch}: no export line")
        model_h5 = os.path.join(run_dir, "model.h5")
        hf_dir = os.path.join(run_dir, "hf")
        ours = h5_tensors(model_h5)
        exported = load_file(os.path.join(hf_dir, "model.safetensors"))
        check(set(ours) == set(exported), f"{arch}: names differ: {set(ours) ^ set(exported)}")
        for name in ours:
            check(name in exported and bitwise_equal(ours[name], exported[name]),
                  f"{arch}: {name} differs")
        print(f"{arch}: {len(exported)} tensors bitwise equal to model.h5")
        with open(os.path.join(hf_dir, "config.json")) as f:
            cfg = json.load(f)
        check(cfg["model_type"] == arch and cfg["vocab_size"] == 256, f"{arch}: config {cfg}")
        if arch == "gpt2":
            check(ours["transformer.h.0.attn.c_attn.weight"].shape == (32, 96), "Conv1D layout")
            check(cfg["n_inner"] == 48 and cfg["n_positions"] == 16, f"gpt2 config {cfg}")
        elif arch == "llama":
            check(ours["model.layers.0.self_attn.k_proj.weight"].shape == (16, 32), "GQA k")
            check(ours["lm_head.weight"].shape == (256, 32), "untied head")
            check(not bitwise_equal(ours["lm_head.weight"], ours["model.embed_tokens.weight"]),
                  "llama: lm_head equals the embedding")
            check(cfg["architectures"] == ["LlamaForCausalLM"] and cfg["hidden_act"] == "silu" and
                  cfg["num_key_value_heads"] == 2 and cfg["num_attention_heads"] == 4 and
                  cfg["intermediate_size"] == 48 and cfg["tie_word_embeddings"] is False and
                  cfg["rope_theta"] == 500.0 and cfg["max_position_embeddings"] == 16 and
                  cfg["torch_dtype"] == "float32", f"llama config {cfg}")
        else:
            check(ours["model.decoder.embed_positions.weight"].shape == (18, 32), "offset 2")
            check(ours["model.decoder.layers.0.fc1.weight"].shape == (48, 32), "Linear layout")
            check(cfg["ffn_dim"] == 48 and cfg["max_position_embeddings"] == 16,
                  f"opt config {cfg}")

        # colossal_export, sharded: the same tensors through the index.
        out = os.path.join(tmp, arch + "-sharded")
        r = run([os.path.join(BIN, "colossal_export"), model_h5, "--out", out,
                 "--max-shard-size", "20KB"])
        check(r.returncode == 0, f"{arch}: colossal_export failed: {r.stderr}")
        shards, index = sharded_tensors(out)
        files = set(index["weight_map"].values())
        check(len(files) > 1, f"{arch}: not sharded: {files}")
        check(not os.path.exists(os.path.join(out, "model.safetensors")), "stray single file")
        total = sum(t.nbytes for t in ours.values())
        check(index["metadata"]["total_size"] == total, f"{arch}: total_size")
        for name in ours:
            check(name in shards and bitwise_equal(ours[name], shards[name]),
                  f"{arch}: sharded {name} differs")
        with open(os.path.join(out, "config.json")) as f:
            check(json.load(f) == cfg, f"{arch}: colossal_export's config.json differs")

        if have_torch:
            cls = {"gpt2": transformers.GPT2LMHeadModel, "opt": transformers.OPTForCausalLM,
                   "llama": transformers.LlamaForCausalLM}[arch]
            for directory in [hf_dir, out]:
                model, info = cls.from_pretrained(directory, output_loading_info=True)
                model.eval()
                check(not info["unexpected_keys"], f"{arch}: unexpected {info['unexpected_keys']}")
                # A tied head is the embedding (transformers reports it missing, then ties);
                # the untied llama's lm_head.weight must be in the file.
                missing = set(info["missing_keys"]) - ({"lm_head.weight"} if arch != "llama"
                                                       else set())
                check(not missing, f"{arch}: missing {missing}")
                check(not info.get("mismatched_keys"), f"{arch}: mismatched shapes")
                tokens = np.frombuffer(open(data, "rb").read(), dtype=np.uint8).astype(np.int64)
                T = 16
                windows = min((len(tokens) - 1) // T, 8)
                x = torch.tensor(np.stack([tokens[i * T:i * T + T] for i in range(windows)]))
                y = torch.tensor(np.stack([tokens[i * T + 1:i * T + T + 1]
                                           for i in range(windows)]))
                with torch.no_grad():
                    logits = model(input_ids=x).logits
                    theirs = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]).double(), y.reshape(-1)).item()
                r = run([os.path.join(BIN, "colossal_eval"), config, "--weights", model_h5])
                check(r.returncode == 0, f"{arch}: colossal_eval failed: {r.stderr}")
                line = [l for l in r.stdout.splitlines() if l.startswith("val loss ")]
                # "val loss X (X to 9 digits)": the 9-digit figure
                mine = float(line[-1].split()[-1].strip("()")) if line else float("nan")
                rel = abs(mine - theirs) / abs(theirs)
                print(f"{arch}: from_pretrained({os.path.basename(directory)}) val loss "
                      f"{theirs:.7f}, colossal_eval {mine:.7f}, relative difference {rel:.2e}")
                check(rel <= 1e-5, f"{arch}: val loss {theirs} vs {mine}")

    # Bad inputs are named.
    exe = os.path.join(BIN, "colossal_export")
    r = run([exe, os.path.join(tmp, "nope.h5"), "--out", os.path.join(tmp, "x")])
    check(r.returncode == 3 and "nope.h5' does not exist" in r.stderr, f"missing: {r.stderr}")
    r = run([exe, data, "--out", os.path.join(tmp, "x")])
    check(r.returncode == 3 and "data.txt" in r.stderr, f"not HDF5: {r.stderr}")
    r = run([exe, os.path.join(tmp, "gpt2", "model.h5")])
    check(r.returncode == 2 and "missing --out DIR" in r.stderr, f"no --out: {r.stderr}")
    r = run([exe, os.path.join(tmp, "gpt2", "model.h5"), "--out", tmp, "--max-shard-size", "big"])
    check(r.returncode == 2 and "'big' is not a size" in r.stderr, f"bad size: {r.stderr}")
    r = run([exe, "--help"])
    check(r.returncode == 0 and "usage: colossal_export" in r.stdout, "--help")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all export checks passed")
