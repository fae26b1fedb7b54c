#!/usr/bin/env python3
"""Cross-check colossal's GPT-2 / OPT forward pass against an independent PyTorch model.

Trains a model with colossal_train for a few steps, loads the written model.h5 into a small
float64 PyTorch model written here from the Hugging Face definitions (not from colossal's
sources), and compares

  1. the validation loss: colossal_eval's "val loss" against the float64 torch loss over the
     same windows (x = tokens[i*T : i*T+T], y = tokens[i*T+1 : i*T+T+1], i < (N-1)//T, capped
     by data.val_windows); passes if |colossal - torch| <= 1e-4 * |torch| + 1e-5;
  2. greedy decoding: colossal_generate --temperature 0 against the float64 torch argmax
     continuation of the same prompt; passes if every token agrees, or if the first
     disagreement is a tie that float32 cannot resolve (torch's logits of the two tokens within
     1e-4 * max|logit| + 1e-5 of each other; reported as a warning).

Exit status 0 when both pass, 1 when either fails, 2 on a usage or tool error. This is a manual
check and is not part of ctest: it needs torch, h5py and yaml, e.g. Debian's
  /usr/bin/python3 tests/reference/check_against_torch.py --config configs/quickstart.yaml
"""
import argparse
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLMC_HEADER_BYTES = 256 * 4
# llm.c token files: magic -> (version, token dtype), as io::TokenFile reads them.
LLMC_FORMATS = {20240520: (1, "<u2"), 20240801: (7, "<u4")}
LN_EPS = 1e-5


def rel_tol_ok(a, ref):
    return abs(a - ref) <= 1e-4 * abs(ref) + 1e-5


# ---------------------------------------------------------------------------------------------
# Model: a plain functional pre-LN transformer over a dict of float64 tensors keyed by the
# Hugging Face state_dict names, written from the HF GPT2LMHeadModel / OPTForCausalLM
# definitions (GPT-2 Conv1D: y = x @ W + b with W [in, out]; OPT nn.Linear: y = x @ W.T + b
# with W [out, in]; OPT positions = arange(T) + 2).


def expected_shapes(m):
    """name -> shape of every parameter colossal must write for config section `m`."""
    L, C, F_, V, S = m["layers"], m["hidden"], m["ffn_hidden"], m["vocab"], m["max_seq"]
    shapes = {}
    if m["arch"] == "gpt2":
        shapes["transformer.wte.weight"] = (V, C)
        shapes["transformer.wpe.weight"] = (S, C)
        for l in range(L):
            h = f"transformer.h.{l}."
            shapes.update({
                h + "ln_1.weight": (C,), h + "ln_1.bias": (C,),
                h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
                h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
                h + "mlp.c_fc.weight": (C, F_), h + "mlp.c_fc.bias": (F_,),
                h + "mlp.c_proj.weight": (F_, C), h + "mlp.c_proj.bias": (C,),
            })
        shapes["transformer.ln_f.weight"] = (C,)
        shapes["transformer.ln_f.bias"] = (C,)
    elif m["arch"] == "opt":
        shapes["model.decoder.embed_tokens.weight"] = (V, C)
        shapes["model.decoder.embed_positions.weight"] = (S + 2, C)
        for l in range(L):
            h = f"model.decoder.layers.{l}."
            shapes.update({
                h + "self_attn_layer_norm.weight": (C,), h + "self_attn_layer_norm.bias": (C,),
                h + "final_layer_norm.weight": (C,), h + "final_layer_norm.bias": (C,),
                h + "fc1.weight": (F_, C), h + "fc1.bias": (F_,),
                h + "fc2.weight": (C, F_), h + "fc2.bias": (C,),
            })
            for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
                shapes[h + f"self_attn.{p}.weight"] = (C, C)
                shapes[h + f"self_attn.{p}.bias"] = (C,)
        shapes["model.decoder.final_layer_norm.weight"] = (C,)
        shapes["model.decoder.final_layer_norm.bias"] = (C,)
    else:
        raise SystemExit(f"error: unknown model.arch {m['arch']!r}")
    return shapes


def load_state(path, m, dtype):
    """Reads model.h5, checks it holds exactly the expected names and shapes."""
    shapes = expected_shapes(m)
    with h5py.File(path, "r") as f:
        names = set(f.keys())
        missing = sorted(set(shapes) - names)
        extra = sorted(names - set(shapes))
        if missing or extra:
            raise SystemExit(f"error: {path}: parameter names differ from the HF layout; "
                             f"missing {missing[:5]}, unexpected {extra[:5]}")
        state = {}
        for name, shape in shapes.items():
            ds = f[name]
            if tuple(ds.shape) != shape or ds.dtype != np.float32:
                raise SystemExit(f"error: {path}: {name} is {ds.dtype} {tuple(ds.shape)}, "
                                 f"expected float32 {shape}")
            state[name] = torch.from_numpy(ds[()]).to(dtype)
    return state


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=LN_EPS)


def attention(q, k, v, heads):
    B, T, C = q.shape
    hd = C // heads
    q, k, v = (t.reshape(B, T, heads, hd).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).reshape(B, T, C)


def forward(state, m, idx):
    """Logits [B, T, V] for token ids idx [B, T] (positions 0 .. T-1)."""
    T, H = idx.shape[1], m["heads"]
    pos = torch.arange(T)
    if m["arch"] == "gpt2":
        s = lambda n: state["transformer." + n]  # noqa: E731
        wte = s("wte.weight")
        x = wte[idx] + s("wpe.weight")[pos]
        for l in range(m["layers"]):
            p = lambda n: s(f"h.{l}.{n}")  # noqa: E731,B023
            a = layer_norm(x, p("ln_1.weight"), p("ln_1.bias"))
            qkv = a @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
            q, k, v = qkv.split(m["hidden"], dim=-1)
            x = x + attention(q, k, v, H) @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
            a = layer_norm(x, p("ln_2.weight"), p("ln_2.bias"))
            a = F.gelu(a @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
            x = x + a @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
        x = layer_norm(x, s("ln_f.weight"), s("ln_f.bias"))
    else:
        s = lambda n: state["model.decoder." + n]  # noqa: E731
        wte = s("embed_tokens.weight")
        x = wte[idx] + s("embed_positions.weight")[pos + 2]
        for l in range(m["layers"]):
            p = lambda n: s(f"layers.{l}.{n}")  # noqa: E731,B023
            lin = lambda t, n: F.linear(t, p(n + ".weight"), p(n + ".bias"))  # noqa: E731,B023
            a = layer_norm(x, p("self_attn_layer_norm.weight"), p("self_attn_layer_norm.bias"))
            y = attention(lin(a, "self_attn.q_proj"), lin(a, "self_attn.k_proj"),
                          lin(a, "self_attn.v_proj"), H)
            x = x + lin(y, "self_attn.out_proj")
            a = layer_norm(x, p("final_layer_norm.weight"), p("final_layer_norm.bias"))
            x = x + lin(F.relu(lin(a, "fc1")), "fc2")
        x = layer_norm(x, s("final_layer_norm.weight"), s("final_layer_norm.bias"))
    return x @ wte.T  # LM head tied to the token embedding


# ---------------------------------------------------------------------------------------------
# Data, as colossal's loader reads it: llm.c token files (uint16 after magic 20240520, version 1;
# uint32 after magic 20240801, version 7) or raw bytes.


def read_tokens(path):
    raw = open(path, "rb").read()
    if len(raw) >= LLMC_HEADER_BYTES:
        header = np.frombuffer(raw[:12], dtype="<i4")
        if int(header[0]) in LLMC_FORMATS:
            version, dtype = LLMC_FORMATS[int(header[0])]
            if header[1] != version:
                raise SystemExit(f"error: {path}: llm.c magic {header[0]} with version "
                                 f"{header[1]} (expected {version})")
            tokens = np.frombuffer(raw[LLMC_HEADER_BYTES:], dtype=dtype)
            return tokens[:header[2]].astype(np.int64)
    return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)


def torch_val_loss(state, m, tokens, T, cap, chunk=16):
    n = (len(tokens) - 1) // T
    windows = cap if 0 < cap < n else n
    if windows < 1:
        raise SystemExit("error: validation data holds no full window")
    total = 0.0
    with torch.no_grad():
        for first in range(0, windows, chunk):
            count = min(chunk, windows - first)
            w = torch.from_numpy(
                np.stack([tokens[(first + i) * T:(first + i) * T + T + 1] for i in range(count)]))
            logits = forward(state, m, w[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                     reduction="sum").item()
    return total / (windows * T), windows


def torch_greedy(state, m, context, n, T):
    """Greedy continuation as colossal_generate does it: the last <= T tokens at positions 0..
    Returns the tokens and, per step, the logits vector (float64) that chose them."""
    context, out, steps = list(context), [], []
    with torch.no_grad():
        for _ in range(n):
            window = torch.tensor([context[-T:]])
            logits = forward(state, m, window)[0, -1]
            nxt = int(torch.argmax(logits))
            steps.append(logits)
            out.append(nxt)
            context.append(nxt)
    return out, steps


# ---------------------------------------------------------------------------------------------
# Running colossal.


def run(cmd, what):
    print("+ " + shlex.join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.decode(errors="replace")[-4000:])
        raise SystemExit(f"error: {what} failed with exit status {proc.returncode}")
    return proc.stdout, proc.stderr.decode(errors="replace")


def parse_val_loss(text, what):
    found = re.findall(r"val loss ([-+0-9.eEnaif]+)", text)
    if not found:
        raise SystemExit(f"error: no 'val loss' in the output of {what}:\n{text[-2000:]}")
    return float(found[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: /usr/bin/python3 tests/reference/check_against_torch.py "
               "--config configs/opt-tiny.yaml --set train.steps=20")
    ap.add_argument("--config", required=True, help="colossal YAML config to train")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override passed to colossal_train (repeatable)")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps (default 20, unless --set train.steps=... is given)")
    ap.add_argument("--weights", default=None,
                    help="skip training and check this existing model.h5 instead")
    ap.add_argument("--prompt", default=None,
                    help="greedy-decoding prompt (default: the config's sample.prompt, or "
                         "'This License' when that is empty)")
    ap.add_argument("--tokens", type=int, default=20, help="greedy tokens to compare (20)")
    ap.add_argument("--bin-dir", default=os.path.join(REPO, "build", "bin"),
                    help="where colossal_train/_eval/_generate are (default build/bin)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--float32", action="store_true",
                    help="also print the torch float32 loss, to show float32 rounding noise")
    ap.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    binary = lambda name: os.path.join(args.bin_dir, name)  # noqa: E731

    tmp = tempfile.mkdtemp(prefix="colossal_refcheck_")
    try:
        # 1. Train.
        train_val = None
        if args.weights:
            weights = args.weights
        else:
            sets = list(args.set)
            if args.steps is not None or not any(s.startswith("train.steps=") for s in sets):
                sets.append(f"train.steps={args.steps if args.steps is not None else 20}")
            sets += [f"log.dir={tmp}", "sample.tokens=0", "eval.every=0"]
            cmd = [binary("colossal_train"), args.config]
            for s in sets:
                cmd += ["--set", s]
            out, err = run(cmd, "colossal_train")
            text = out.decode(errors="replace") + err
            found = re.findall(r"val loss ([-+0-9.eEnaif]+)", text)
            train_val = float(found[-1]) if found else None
            weights = os.path.join(tmp, "model.h5")

        # 2. Load the weights and the resolved config stored with them.
        with h5py.File(weights, "r") as f:
            cfg_text = f.attrs["config"]
        cfg_text = cfg_text.decode() if isinstance(cfg_text, bytes) else str(cfg_text)
        cfg = yaml.safe_load(cfg_text)
        m, T = cfg["model"], cfg["train"]["seq_len"]
        if m["hidden"] % m["heads"]:
            raise SystemExit("error: model.hidden is not divisible by model.heads")
        resolved = os.path.join(tmp, "resolved.yaml")
        with open(resolved, "w") as f:
            f.write(cfg_text)
        print(f"model: arch={m['arch']} layers={m['layers']} hidden={m['hidden']} "
              f"heads={m['heads']} ffn_hidden={m['ffn_hidden']} vocab={m['vocab']} "
              f"max_seq={m['max_seq']} seq_len={T}")
        state64 = load_state(weights, m, torch.float64)

        # 3. Reference validation loss (float64), plus float32 for scale.
        val_path = cfg["data"].get("val_path") or ""
        if not val_path:
            raise SystemExit("error: the config has no data.val_path")
        tokens = read_tokens(val_path)
        cap = int(cfg["data"].get("val_windows") or 0)
        ref, windows = torch_val_loss(state64, m, tokens, T, cap)
        ref32 = None
        if args.float32:
            ref32, _ = torch_val_loss(load_state(weights, m, torch.float32), m, tokens, T, cap)

        # 4. colossal_eval on the same weights and resolved config.
        out, err = run([binary("colossal_eval"), resolved, "--weights", weights], "colossal_eval")
        got = parse_val_loss(out.decode(errors="replace"), "colossal_eval")

        diff = got - ref
        loss_ok = rel_tol_ok(got, ref)
        print(f"\nvalidation loss over {windows} windows of {T} tokens ({val_path}):")
        print(f"  torch float64 (reference) {ref:.9f}")
        if ref32 is not None:
            print(f"  torch float32             {ref32:.9f}   "
                  f"(rel diff {(ref32 - ref) / ref:+.2e})")
        print(f"  colossal_eval             {got:.9g}   (rel diff {diff / ref:+.2e}; "
              f"printed to 6 significant digits)")
        if train_val is not None:
            print(f"  colossal_train end-of-run {train_val:.9g}")
        print(f"  tolerance |diff| <= 1e-4*|ref| + 1e-5 = {1e-4 * abs(ref) + 1e-5:.2e}: "
              f"|diff| = {abs(diff):.2e} -> {'PASS' if loss_ok else 'FAIL'}")

        # 5. Greedy decoding.
        prompt = args.prompt
        if prompt is None:
            prompt = (cfg.get("sample") or {}).get("prompt") or "This License"
        if prompt == "":
            prompt = "\n"  # what colossal_generate uses for an empty prompt
        V = m["vocab"]
        pbytes = prompt.encode()
        context = [b % V for b in pbytes]
        out, _ = run([binary("colossal_generate"), resolved, "--weights", weights,
                      "--prompt", prompt, "--tokens", str(args.tokens), "--temperature", "0"],
                     "colossal_generate")
        if not out.startswith(pbytes):
            raise SystemExit(f"error: colossal_generate output does not start with the prompt: "
                             f"{out[:200]!r}")
        rest = out[len(pbytes):]
        if V <= 256:
            if len(rest) != args.tokens + 1 or not rest.endswith(b"\n"):
                raise SystemExit(f"error: expected {args.tokens} bytes and a newline after the "
                                 f"prompt, got {rest!r} (a generated 0 byte truncates the output)")
            theirs = list(rest[:-1])
        else:
            theirs = [int(t) for t in rest.split()]
            if len(theirs) != args.tokens:
                raise SystemExit(f"error: expected {args.tokens} token ids, got {rest!r}")
        mine, steps = torch_greedy(state64, m, context, args.tokens, T)
        show = (lambda ts: repr(bytes(ts).decode("latin-1"))) if V <= 256 else str
        print(f"\ngreedy decoding of {prompt!r}, {args.tokens} tokens:")
        print(f"  torch float64 {show(mine)}")
        print(f"  colossal      {show(theirs)}")
        mismatch = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        margins = []
        for lg in steps:
            top2 = torch.topk(lg, 2).values
            margins.append(float(top2[0] - top2[1]))
        if mismatch is None:
            greedy_ok = True
            print(f"  all {args.tokens} tokens agree -> PASS (smallest torch top-1/top-2 logit "
                  f"margin {min(margins):.3e})")
        else:
            lg = steps[mismatch]
            gap = float(lg[mine[mismatch]] - lg[theirs[mismatch]])
            tie_tol = 1e-4 * float(lg.abs().max()) + 1e-5
            greedy_ok = gap <= tie_tol
            print(f"  first mismatch at generated token {mismatch}: torch {mine[mismatch]}, "
                  f"colossal {theirs[mismatch]}; torch logit gap between them {gap:.3e} "
                  f"(float32 tie tolerance {tie_tol:.2e}) -> "
                  f"{'PASS (a near-tie, WARNING)' if greedy_ok else 'FAIL'}")

        ok = loss_ok and greedy_ok
        print(f"\n{'PASS' if ok else 'FAIL'}: val loss colossal {got:.6g} vs torch {ref:.6g} "
              f"(rel diff {diff / ref:+.2e}), greedy "
              f"{'match' if mismatch is None else f'mismatch at {mismatch}'}")
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            sys.exit(2)
        raise
