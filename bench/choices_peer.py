#!/usr/bin/env python3
"""Hugging Face transformers scoring a multiple-choice file on the CPU: the peer of
bench/run_choices_bench.sh (never a dependency of colossal).

Loads a model folder (colossal_export's output, so the same weights as colossal_eval's) and
scores each example the way the common PyTorch HellaSwag scripts do: its completions as one
batch, each row the context and the completion, right-padded to the longest, one forward, the
cross-entropy of the completion's tokens summed. Prints "completions_per_s=<value>",
"accuracy_per_token=<value>" and, with --csv, writes each completion's summed loss in file
order (one per line) to compare with colossal_eval --choices-out. One untimed example first.
"""
import argparse
import importlib.util
import os
import time

import torch
from transformers import AutoModelForCausalLM


def read_choices(path):
    """[(label, context, completions)] through scripts/make_choices.py's reader."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "make_choices", os.path.join(here, "..", "scripts", "make_choices.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(label, context, completions)
            for _, label, context, completions in module.read_file(path)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model folder")
    ap.add_argument("--choices", required=True, help="a multiple-choice file (llm.c's format)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--csv", help="write each completion's summed loss here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()  # fp32, as saved
    examples = read_choices(args.choices)

    def score(context, completions):
        rows = [context + c for c in completions]
        width = max(len(r) for r in rows) - 1
        inputs = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            inputs[i, :len(r) - 1] = torch.tensor(r[:-1])
        logp = torch.log_softmax(model(inputs).logits.float(), -1)
        losses = []
        for i, c in enumerate(completions):
            positions = torch.arange(len(context) - 1, len(context) - 1 + len(c))
            losses.append(-logp[i, positions, torch.tensor(c)].sum().item())
        return losses

    with torch.inference_mode():
        score(examples[0][1], examples[0][2])
        start = time.perf_counter()
        scored = [score(context, completions) for _, context, completions in examples]
        seconds = time.perf_counter() - start
    completions = sum(len(s) for s in scored)
    right = sum(min(range(len(s)), key=lambda k: s[k] / len(ex[2][k])) == ex[0]
                for s, ex in zip(scored, examples))
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("".join(f"{loss:.9g}\n" for s in scored for loss in s))
    print(f"completions_per_s={completions / seconds:.3f}")
    print(f"accuracy_per_token={right / len(examples):.4f}")


if __name__ == "__main__":
    main()
