#!/usr/bin/env python3
"""colossal's LLaMA (model.arch: llama) against Hugging Face transformers' LlamaForCausalLM.

Builds a small LlamaForCausalLM from a LlamaConfig (grouped-query attention with fewer key/value
heads than query heads, an untied lm_head, rotary positions, RMSNorm, SwiGLU) with random
weights, writes its state_dict into a colossal model.h5 by hand (colossal's parameter names and
[out, in] layouts are Hugging Face's, so this is a plain copy of every tensor), runs colossal_eval
on it over fixed tokens, and compares the validation loss with transformers' (float64) over the
same windows: x = tokens[i*T : i*T+T], y = tokens[i*T+1 : i*T+T+1] for i < (N-1)//T.
Twice: with the plain rotary embedding and with Llama 3's scaled one (rope_type llama3, an
original context of 16 positions, so that the scaling moves the frequencies T = 32 reaches).
Passes when |colossal - transformers| <= 1e-5 * |transformers| both times.

Exit status: 0 pass, 1 fail, 2 tool error, 77 (ctest's skip) when torch, transformers or h5py is
not importable. ctest runs it as reference/llama_transformers with the python3 on PATH, e.g.
after activating a virtual environment that has torch and transformers.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:  # not an error: the reference is optional
    print(f"skipped: {e}")
    sys.exit(77)

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, MAX_SEQ = 2, 64, 4, 2, 96, 256, 64
ROPE_THETA, RMS_EPS, SEQ_LEN = 500.0, 1e-5, 32
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)


def build_reference(scaling):
    kwargs = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_SEQ,
                  rms_norm_eps=RMS_EPS, tie_word_embeddings=False, attention_bias=False,
                  mlp_bias=False, hidden_act="silu")
    config = LlamaConfig(rope_theta=ROPE_THETA, rope_scaling=scaling, **kwargs)
    # transformers >= 5 keeps the base and the scaling in rope_parameters; older ones in
    # rope_theta and rope_scaling.
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        params["rope_theta"] = ROPE_THETA
        params.update(scaling or {"rope_type": "default"})
    if scaling is not None:
        # The model's own frequencies must be the scaled ones (else the check proves nothing).
        model = LlamaForCausalLM(config)
        plain = 1.0 / ROPE_THETA ** (torch.arange(0, HIDDEN // HEADS, 2).double() / (HIDDEN // HEADS))
        inv = model.model.rotary_emb.inv_freq.double()
        if torch.allclose(inv, plain, rtol=1e-6):
            raise RuntimeError("transformers ignored rope_scaling: " + str(scaling))
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config).eval()
    # Weights well away from the tiny default init, so every layer moves the loss.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def write_model_h5(model, path):
    state = model.state_dict()
    with h5py.File(path, "w") as f:
        for name, tensor in state.items():
            if "rotary_emb" in name:  # a buffer of transformers, not a parameter
                continue
            f.create_dataset(name, data=tensor.detach().to(torch.float32).cpu().numpy())
        f.attrs["format"] = "colossal-model"
        f.attrs["format_version"] = 1
    return [n for n in state if "rotary_emb" not in n]


def reference_loss(model, tokens):
    T = SEQ_LEN
    windows = (len(tokens) - 1) // T
    x = torch.tensor([tokens[i * T:i * T + T] for i in range(windows)], dtype=torch.long)
    y = torch.tensor([tokens[i * T + 1:i * T + T + 1] for i in range(windows)], dtype=torch.long)
    with torch.no_grad():
        logits = model.double()(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    return float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True, help="where colossal_eval is")
    args = ap.parse_args()
    status = 0
    for scaling in (None, LLAMA3):
        status = max(status, check(args, scaling))
    return status


def check(args, scaling):
    print(f"rope_scaling: {scaling}")
    rope_keys = ""
    if scaling is not None:
        rope_keys = (f", rope_factor: {scaling['factor']}, "
                     f"rope_low_freq_factor: {scaling['low_freq_factor']}, "
                     f"rope_high_freq_factor: {scaling['high_freq_factor']}, "
                     f"rope_original_max_seq: {scaling['original_max_position_embeddings']}")
    with tempfile.TemporaryDirectory(prefix="colossal_llama_ref_") as tmp:
        # Fixed text: bytes are the tokens (vocabulary 256).
        rng = np.random.default_rng(7)
        words = ["the ", "llama ", "grouped ", "query ", "rotary ", "and ", "of ", "\n"]
        text = "".join(words[i] for i in rng.integers(0, len(words), 400))[:4 * SEQ_LEN + 1]
        data = os.path.join(tmp, "val.txt")
        with open(data, "w") as f:
            f.write(text)
        tokens = list(text.encode())
        model = build_reference(scaling)
        weights = os.path.join(tmp, "model.h5")
        names = write_model_h5(model, weights)
        if "lm_head.weight" not in names or len(names) != 3 + 9 * LAYERS:
            print(f"unexpected state_dict of {len(names)} tensors: {names}")
            return 2
        config = os.path.join(tmp, "llama.yaml")
        with open(config, "w") as f:
            f.write(f"model: {{arch: llama, layers: {LAYERS}, hidden: {HIDDEN}, heads: {HEADS}, "
                    f"kv_heads: {KV_HEADS}, ffn_hidden: {FFN}, vocab: {VOCAB}, "
                    f"max_seq: {MAX_SEQ}, rope_theta: {ROPE_THETA}, rms_eps: {RMS_EPS}, "
                    f"tie_embeddings: false{rope_keys}}}\n"
                    f"data: {{path: {data}, val_path: {data}, val_windows: 0}}\n"
                    f"train: {{steps: 1, seq_len: {SEQ_LEN}, global_batch: 1, micro_batch: 1}}\n"
                    f"log: {{dir: {os.path.join(tmp, 'log')}}}\n")
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        proc = subprocess.run([os.path.join(args.bin_dir, "colossal_eval"), config,
                               "--weights", weights], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
        out = proc.stdout.decode(errors="replace")
        if proc.returncode != 0:
            print(out + proc.stderr.decode(errors="replace"))
            print(f"colossal_eval failed with status {proc.returncode}")
            return 2
        found = re.search(r"val loss\s+([0-9.eE+-]+|nan|inf)", out)
        if not found:
            print(out)
            print("no 'val loss' in colossal_eval's output")
            return 2
        got = float(found.group(1))
        want = reference_loss(model, tokens)
        rel = abs(got - want) / abs(want)
        print(f"transformers LlamaForCausalLM (float64) {want:.9g}")
        print(f"colossal_eval                           {got:.9g}   (rel diff {rel:.2e})")
        if not rel <= 1e-5:
            print("FAIL: the losses differ by more than 1e-5 relative")
            return 1
        print("PASS")
        return 0


if __name__ == "__main__":
    sys.exit(main())
