#!/usr/bin/env python3
"""Hugging Face transformers' greedy generation on the CPU: the peer of
bench/run_generate_bench.sh (never a dependency of colossal).

A GPT2LMHeadModel built from a config (no download; GPT-2 small's shape unless told otherwise)
continues a prompt of --prompt-tokens ids by --tokens greedy tokens, with its KV cache
(use_cache=True) or without (every token a forward over the whole context so far), and prints
one line: "tokens_per_s=<value>". One untimed warm-up generation first.
"""
import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100, help="tokens to generate (default 100)")
    ap.add_argument("--prompt-tokens", type=int, default=1, help="prompt length (default 1)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--no-cache", action="store_true", help="use_cache=False")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads,
                        vocab_size=args.vocab)
    model = GPT2LMHeadModel(config).eval()
    prompt = torch.randint(0, args.vocab, (1, args.prompt_tokens))

    def generate(n: int) -> None:
        model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       use_cache=not args.no_cache, pad_token_id=0,
                       attention_mask=torch.ones_like(prompt))

    with torch.inference_mode():
        generate(4)
        start = time.perf_counter()
        generate(args.tokens)
        seconds = time.perf_counter() - start
    print(f"tokens_per_s={args.tokens / seconds:.3f}")


if __name__ == "__main__":
    main()
