#!/usr/bin/env python3
"""The PyTorch side of `bench step`: one GPT-2 training step on the CPU with the same shapes,
optimizer and thread count as stabletrain's, timed the same way. GPT-2 as llm.c / nanoGPT
write it: learned positions, pre-LayerNorm blocks, causal attention, tanh-GELU MLP, LM head
tied to the token embedding (vocabulary padded to a multiple of 128, as stabletrain pads
it), FP32; AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D weights) after
global-norm clipping at 1.0. Random tokens, a fresh batch each step. Step 0 is a warm-up.

Prints one JSON object: {"times": [seconds per timed step], "params": N, "first_loss",
"last_loss", "torch": version, "threads": n}.

usage: bench_torch_train.py --layers 12 --heads 12 --embd 768 --vocab 50257
       --max-seq-len 1024 --B 4 --T 64 --steps 5 --threads 2
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


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
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits[..., : self.V].reshape(-1, self.V), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, v in [("layers", 12), ("heads", 12), ("embd", 768), ("vocab", 50257),
                 ("max-seq-len", 1024), ("B", 4), ("T", 64), ("steps", 5), ("threads", 2)]:
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    m = GPT2(a.layers, a.heads, a.embd, a.vocab, a.max_seq_len)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1)
    times, losses = [], []
    for s in range(a.steps + 1):
        idx = torch.randint(a.vocab, (a.B, a.T), generator=g)
        tgt = torch.randint(a.vocab, (a.B, a.T), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = m(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        t1 = time.perf_counter()
        losses.append(loss.item())
        if s > 0:
            times.append(t1 - t0)
    print(json.dumps({"times": times, "params": sum(p.numel() for p in m.parameters()),
                      "first_loss": losses[0], "last_loss": losses[-1],
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
