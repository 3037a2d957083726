#!/usr/bin/env python3
"""Side-by-side reference for bench_gpu: PyTorch's BF16 GEMM (F.linear, i.e. cuBLASLt via
torch) in TFLOP/s on the same GPT-2 124M shapes (N = 8192 tokens, C = 768), timed the same
way (CUDA events, warm-up, median). Run twice: with BF16 reduced-precision split-K
reductions disallowed (the same numerics as stabletrain's GEMM) and allowed (torch's
default). With --ours bench_gpu.txt, bench_gpu's figures are joined in a table:
kernel | stabletrain | torch | ratio.

usage: bench_torch_gemm.py [--ours BENCH_GPU_OUTPUT] [--reps N]
"""
import argparse
import re
import sys

from bench_torch_timing import median_ms

N = 8192
C = 768
# (name as bench_gpu prints it, in features, out features, bias)
SHAPES = [
    ("qkv      C->3C", C, 3 * C, True),
    ("attn out C->C", C, C, True),
    ("fc       C->4C", C, 4 * C, True),
    ("fc proj 4C->C", 4 * C, C, True),
    ("lm head  C->50304", C, 50304, False),
]


def parse_ours(path):
    """bench_gpu's table rows '| gemm bf16 <name> [+bias] | 123.4 TFLOP/s | ...' -> {name: tflops}."""
    ours = {}
    with open(path) as f:
        for line in f:
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) < 2 or not cols[0].startswith("gemm bf16 "):
                continue
            name = " ".join(cols[0][len("gemm bf16 "):].replace("+bias", "").split())
            m = re.match(r"([0-9.]+) TFLOP/s", cols[1])
            if m:
                ours[name] = float(m.group(1))
    return ours


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", help="bench_gpu output to put side by side")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("bench_torch_gemm: torch has no CUDA device available", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    default_reduced = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}; default allow_bf16_reduced_precision_reduction="
          f"{default_reduced}")
    print(f"timing: CUDA events, 3 warm-up + median of {args.reps} runs\n")

    gen = torch.Generator(device=dev).manual_seed(1)
    results = {}
    for name, cin, cout, has_bias in SHAPES:
        x = torch.randn(N, cin, device=dev, generator=gen).to(torch.bfloat16)
        w = (0.02 * torch.randn(cout, cin, device=dev, generator=gen)).to(torch.bfloat16)
        b = (0.1 * torch.randn(cout, device=dev, generator=gen)).to(torch.bfloat16) if has_bias else None
        flop = 2.0 * N * cin * cout
        row = []
        for reduced in (False, True):
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
            ms = median_ms(torch, lambda: F.linear(x, w, b), 3, args.reps)
            row.append(flop / (ms * 1e-3) / 1e12)
        results[name] = row
        del x, w, b
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = default_reduced

    ours = parse_ours(args.ours) if args.ours else {}
    print("| kernel | stabletrain TFLOP/s | torch TFLOP/s (same numerics) | ratio | "
          "torch TFLOP/s (reduced-precision split-K allowed) |")
    print("|---|---|---|---|---|")
    for name, _, _, has_bias in SHAPES:
        same, reduced = results[name]
        key = " ".join(name.split())
        mine = ours.get(key)
        label = f"gemm bf16 {name}" + (" +bias" if has_bias else "")
        mine_s = f"{mine:.1f}" if mine is not None else "-"
        ratio_s = f"{mine / same:.2f}" if mine is not None else "-"
        print(f"| {label} | {mine_s} | {same:.1f} | {ratio_s} | {reduced:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
