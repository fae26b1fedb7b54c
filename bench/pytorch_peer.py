#!/usr/bin/env python3
"""PyTorch peer benchmark: training throughput of a hand-written GPT-2 / OPT (CPU or CUDA).

This is the yardstick colossal's own trainer is compared against, so it deliberately mirrors
colossal's model and optimizer (pre-LN blocks, tied LM head, fp32, AdamW with colossal's decay
rule, global-norm clipping) and nothing else: no `transformers`, no dropout, no data loading.
Tokens are random because only speed is measured.

Progress goes to stderr; stdout gets exactly one line at the end:
  RESULT peer=pytorch preset=<p> threads=<n> tokens_per_s=<x> step_s=<x> peak_rss_mib=<x>
With --device cuda the model, tokens and optimizer live on the GPU (autocast on "cuda" for --bf16,
fused AdamW, TF32 only with --tf32) and the RESULT line adds peak_gpu_mib and mfu (against
--peak-tflops).
Run it through run_pytorch_peer.sh to get the allocator/threading environment it is best in.
"""
import argparse
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Presets: model shape plus the batch shape each is benchmarked at.
PRESETS = {
    "gpt2-124m": dict(layers=12, hidden=768, heads=12, vocab=50257, max_positions=1024,
                      seq_len=256, batch=4),
    "quickstart": dict(layers=4, hidden=256, heads=8, vocab=256, max_positions=128,
                       seq_len=128, batch=16),
    "tiny": dict(layers=4, hidden=256, heads=4, vocab=256, max_positions=128,
                 seq_len=128, batch=8),
}


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.arch, self.sdpa = cfg.heads, cfg.arch, cfg.sdpa
        d = cfg.hidden
        if cfg.arch == "gpt2":
            self.c_attn = nn.Linear(d, 3 * d)  # fused q|k|v, as in GPT-2's Conv1D
        else:
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d) for _ in range(3))
        self.out_proj = nn.Linear(d, d)
        self.out_proj.residual_out = True
        # Built once at max length and sliced, so no mask is allocated per step.
        mask = torch.ones(cfg.max_positions, cfg.max_positions, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        if self.arch == "gpt2":
            q, k, v = self.c_attn(x).split(C, dim=2)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:  # torch 2.x: the fused causal kernel (flash / memory-efficient on CPU)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13 has no scaled_dot_product_attention: matmul, mask, softmax
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads))
            att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.hidden
        self.ln_1, self.ln_2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.attn = Attention(cfg)
        self.fc_in, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.fc_out.residual_out = True
        self.act = (lambda t: F.gelu(t, approximate="tanh")) if cfg.arch == "gpt2" else F.relu

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.fc_out(self.act(self.fc_in(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        # OPT's learned position table carries 2 extra leading rows (a fairseq padding legacy).
        self.pos_offset = 2 if cfg.arch == "opt" else 0
        self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.max_positions + self.pos_offset, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden, eps=1e-5)
        self._init(cfg.layers)

    def _init(self, layers):
        # Same rule as colossal's ParamRole: normal(0, 0.02); projections into the residual
        # stream scaled by 1/sqrt(2*layers); biases 0; LayerNorm weights 1 (nn default).
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                std = 0.02 / math.sqrt(2 * layers) if getattr(m, "residual_out", False) else 0.02
                nn.init.normal_(m.weight, 0.0, std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(self.pos_offset, T + self.pos_offset, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # LM head tied to the token embedding
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def make_optimizer(model, args):
    # colossal decays embeddings and weight matrices, never LayerNorm parameters or biases;
    # every matrix/embedding here is >= 2-D and everything else is 1-D.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    # foreach batches the per-tensor update loop; it is an option because on CPU it can go
    # either way and the peer should be given whichever is faster.
    if args.device == "cuda":  # the fastest AdamW PyTorch has on a GPU: one fused kernel
        return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                             foreach=args.foreach)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpt2-124m",
                   help="model and batch shape (default gpt2-124m); the options below override "
                        "single fields of it")
    p.add_argument("--arch", choices=["gpt2", "opt"], default="gpt2",
                   help="gpt2: fused qkv, GELU; opt: separate q/k/v, ReLU, positions offset 2")
    for name in ("layers", "hidden", "heads", "vocab", "max-positions", "seq-len", "batch"):
        p.add_argument("--" + name, type=int, default=None, help="from --preset unless given")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup-steps", type=int, default=2,
                   help="untimed steps run first (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--foreach", action=argparse.BooleanOptionalAction, default=False,
                   help="AdamW's multi-tensor (foreach) implementation (default off)")
    p.add_argument("--sdpa", action=argparse.BooleanOptionalAction, default=None,
                   help="attention by F.scaled_dot_product_attention (default: when torch has it)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (torch 2.x; inductor's fused CPU kernels)")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 autocast on the CPU (oneDNN's AVX512-BF16/AMX kernels where the "
                        "CPU has them); weights and AdamW stay fp32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model trains (default cpu); cuda: the first visible GPU")
    p.add_argument("--tf32", action="store_true",
                   help="cuda: let fp32 products use TF32 tensor cores (default off, as ours)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="cuda: dense bf16 peak for the MFU column (default 989, H100/H200 SXM)")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no GPU (torch.cuda.is_available() is False)")
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    if args.sdpa is None:
        args.sdpa = has_sdpa
    if args.sdpa and not has_sdpa:
        p.error(f"--sdpa needs torch 2.x (this is {torch.__version__})")
    if args.compile and not hasattr(torch, "compile"):
        p.error(f"--compile needs torch 2.x (this is {torch.__version__})")
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.hidden % args.heads:
        p.error("--hidden must be divisible by --heads")
    if args.seq_len > args.max_positions:
        p.error("--seq-len must not exceed --max-positions")
    if args.steps < 1 or args.warmup_steps < 0 or args.threads < 1:
        p.error("--steps >= 1, --warmup-steps >= 0 and --threads >= 1 are required")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    dev = torch.device(args.device)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    model = GPT(args).to(dev)
    model.train()
    opt = make_optimizer(model, args)
    forward = torch.compile(model) if args.compile else model
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    tokens_per_step = args.batch * args.seq_len
    print(f"pytorch {torch.__version__}: {args.preset} arch={args.arch} L={args.layers} "
          f"d={args.hidden} H={args.heads} V={args.vocab} T={args.seq_len} B={args.batch} "
          f"params={n_params / 1e6:.2f}M threads={torch.get_num_threads()} "
          f"sdpa={args.sdpa} compile={args.compile} bf16={args.bf16}",
          file=sys.stderr, flush=True)

    def step():
        # Fresh random tokens each step, so no cache effect flatters a repeated batch.
        data = torch.randint(args.vocab, (args.batch, args.seq_len + 1)).to(dev, non_blocking=True)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16):
            loss = forward(data[:, :-1], data[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()  # forces the step to finish before the clock is read

    for i in range(args.warmup_steps):
        t0 = time.perf_counter()
        loss = step()
        print(f"warmup {i + 1}/{args.warmup_steps}: loss {loss:.4f} "
              f"{time.perf_counter() - t0:.3f}s", file=sys.stderr, flush=True)

    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
        print(f"step {i + 1}/{args.steps}: loss {loss:.4f} {times[-1]:.3f}s "
              f"({tokens_per_step / times[-1]:.0f} tok/s)", file=sys.stderr, flush=True)

    step_s = sum(times) / len(times)
    # ru_maxrss is KiB on Linux.
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    config = ("compile" if args.compile else "eager") + ("+bf16" if args.bf16 else "")
    extra = ""
    if args.device == "cuda":
        # Model FLOPs per token as colossal counts them: 6N + 12 L T d (N without positions).
        n = n_params - model.wpe.weight.numel()
        flops = (6 * n + 12 * args.layers * args.seq_len * args.hidden) * tokens_per_step / step_s
        extra = (f" device=cuda peak_gpu_mib={torch.cuda.max_memory_allocated() / 2**20:.1f}"
                 f" mfu={100 * flops / (args.peak_tflops * 1e12):.1f}%")
        config += "+tf32" if args.tf32 else ""
    print(f"RESULT peer=pytorch-{torch.__version__.split('+')[0]} config={config} "
          f"preset={args.preset} B={args.batch} T={args.seq_len} threads={args.threads} "
          f"tokens_per_s={tokens_per_step / step_s:.1f} step_s={step_s:.4f} "
          f"peak_rss_mib={peak_rss_mib:.1f}{extra}", flush=True)


if __name__ == "__main__":
    main()
