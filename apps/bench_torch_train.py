#!/usr/bin/env python3
"""The PyTorch side of `bench step` (CPU) and `bench train` (GPU): one GPT-2 training step with
the same shapes and optimizer as stabletrain's, timed the same way. GPT-2 as llm.c / nanoGPT
write it: learned positions, pre-LayerNorm blocks, causal attention, tanh-GELU MLP, LM head
tied to the token embedding (vocabulary padded to a multiple of 128, as stabletrain pads
it), FP32; AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D weights) after
global-norm clipping at 1.0. Random tokens, a fresh batch each step. Step 0 is a warm-up.

CPU (default): FP32, the thread count given. Prints one JSON object: {"times": [seconds per
timed step], "params": N, "first_loss", "last_loss", "torch": version, "threads": n}.

GPU (--device cuda): the step as a PyTorch user writes it for speed: BF16 autocast (FP32
weights and optimizer state, as our FP32 master weights), F.scaled_dot_product_attention
(causal; PyTorch picks its flash kernel), fused AdamW, and with --compile 1 the model under
torch.compile (default mode). Timed with torch.cuda.synchronize() around each step after
--warmup steps; prints the JSON object (with "tokens_per_s", "mfu", "peak_gib", "mode") and,
with --table, one markdown row: mode, B, T, ms/step (median, min, max), tokens/s, MFU.
MFU: (6 N + 6 L C T) FLOPs per token (N with the padded vocabulary, as `bench train`) over
--peak-tflops (989, the H100/H200 dense BF16 datasheet figure).

usage: bench_torch_train.py --layers 12 --heads 12 --embd 768 --vocab 50257
       --max-seq-len 1024 --B 4 --T 64 --steps 5 --threads 2
       bench_torch_train.py --device cuda --B 64 --T 1024 --steps 10 --warmup 3 [--compile 1] --table
"""
import argparse
import ctypes
import json
import math
import os
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def blas_kernels():
    """The kernel set of the OpenBLAS that torch loaded ("Haswell", ...), or what torch says
    its BLAS is when that is not OpenBLAS."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")  # the copy already loaded through libblas.so.3
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return "OpenBLAS " + lib.openblas_get_corename().decode() + " kernels"
    except (OSError, AttributeError):
        cfg = torch.__config__.show()
        return next((l.strip() for l in cfg.splitlines() if "BLAS_INFO" in l), "unknown BLAS")


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.x: materialised softmax, as stabletrain's baseline backend
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
            y = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, H, C, V, maxT):
        super().__init__()
        self.Vp = (V + 127) // 128 * 128
        self.wte = nn.Embedding(self.Vp, C)
        self.wpe = nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.register_buffer("mask", torch.ones(maxT, maxT, dtype=torch.bool).triu(1))
        self.V = V
        for mod in self.modules():  # GPT-2's initialisation: N(0, 0.02), zero biases
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, 0.0, 0.02)
            if isinstance(mod, nn.Linear):
                nn.init.zeros_(mod.bias)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits[..., : self.V].reshape(-1, self.V), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, v in [("layers", 12), ("heads", 12), ("embd", 768), ("vocab", 50257),
                 ("max-seq-len", 1024), ("B", 4), ("T", 64), ("steps", 5), ("threads", 2),
                 ("warmup", 1), ("compile", 0)]:
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    if not cuda:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    dev = torch.device(a.device)
    m = GPT2(a.layers, a.heads, a.embd, a.vocab, a.max_seq_len).to(dev)
    params = sum(p.numel() for p in m.parameters())
    decay = [p for p in m.parameters() if p.dim() >= 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    step_model = torch.compile(m) if a.compile else m
    g = torch.Generator(device=dev).manual_seed(1)
    times, losses = [], []
    faults0 = 0
    for s in range(a.steps + a.warmup):
        idx = torch.randint(a.vocab, (a.B, a.T), generator=g, device=dev)
        tgt = torch.randint(a.vocab, (a.B, a.T), generator=g, device=dev)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if cuda:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = step_model(idx, tgt)
        else:
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        losses.append(loss.item())
        if s >= a.warmup:
            times.append(t1 - t0)
        if s + 1 == a.warmup:
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = {"times": times, "params": params, "first_loss": losses[0], "last_loss": losses[-1],
           "torch": torch.__version__, "threads": torch.get_num_threads()}
    if not cuda:  # what ran: the BLAS kernels (as stabletrain's bench prints its own) and the wait policy
        out["blas"] = blas_kernels()
        out["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "OpenMP's default")
        # minor page faults per timed step (allocator churn: bench.cpp's TorchVariant)
        out["minor_faults_per_step"] = (
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / max(1, a.steps)
    if cuda:
        med = sorted(times)[len(times) // 2]
        tps = a.B * a.T / med
        flops = 6 * params + 6 * a.layers * a.embd * a.T
        out.update({"device": torch.cuda.get_device_name(), "B": a.B, "T": a.T,
                    "mode": ("bf16 autocast, SDPA, fused AdamW" +
                             (", torch.compile" if a.compile else ", eager")),
                    "median_s": med, "tokens_per_s": tps,
                    "mfu": tps * flops / (a.peak_tflops * 1e12),
                    "peak_gib": torch.cuda.max_memory_allocated() / 2**30})
    print(json.dumps(out), flush=True)
    if a.table and cuda:
        print("| step | B | T | ms/step (median) | tokens/s | MFU | peak GiB | loss |")
        print("|---|---|---|---|---|---|---|---|")
        print(f"| PyTorch {torch.__version__} {out['mode']} | {a.B} | {a.T} | {1e3 * med:.1f} "
              f"(min {1e3 * min(times):.1f}, max {1e3 * max(times):.1f}) | {tps:.0f} | "
              f"{100 * out['mfu']:.1f}% | {out['peak_gib']:.2f} | "
              f"{out['first_loss']:.4f} -> {out['last_loss']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
