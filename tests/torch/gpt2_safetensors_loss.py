#!/usr/bin/env python3
"""Validation loss of a GPT-2 safetensors export, computed independently with PyTorch.

Reads the safetensors file directly (JSON header + numpy; torch 1.13 has no safetensors
package), builds GPT-2 from the Hugging Face tensor names (Conv1D weights stored (in, out)),
and averages the mean cross-entropy of the first N batches of an llm.c token shard, served
the way stabletrain's evaluation does: window w = tokens [w*T, w*T + T + 1), batch i =
windows i*B .. i*B + B - 1.

usage: gpt2_safetensors_loss.py MODEL.safetensors VAL_SHARD.bin B T N_BATCHES N_HEAD
prints: {"loss_fp32": ..., "loss_fp64": ...}
"""
import json
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[base + b:base + end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: {name}: dtype {e['dtype']} not handled")
        out[name] = torch.from_numpy(a.copy().reshape(e["shape"]))
    return out


def read_shard(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        assert header[0] == 20240520 and header[1] == 1, f"{path}: not an llm.c token shard"
        tokens = np.frombuffer(f.read(), dtype="<u2")
    assert len(tokens) == header[2], f"{path}: size does not match the header"
    return tokens.astype(np.int64)


def gpt2_loss(w, idx, targets, n_head, dtype):
    w = {k: v.to(dtype) for k, v in w.items()}
    B, T = idx.shape
    C = w["transformer.wte.weight"].shape[1]
    L = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("transformer.h."))
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: (in, out)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (C // n_head) ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], 1e-5)
    logits = x @ w["transformer.wte.weight"].T  # lm_head tied to wte
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1)).item()


def main():
    model, shard, B, T, n, n_head = sys.argv[1:7]
    B, T, n, n_head = int(B), int(T), int(n), int(n_head)
    w = read_safetensors(model)
    toks = read_shard(shard)
    result = {}
    for name, dtype in (("loss_fp32", torch.float32), ("loss_fp64", torch.float64)):
        total = 0.0
        for i in range(n):
            win = [toks[(i * B + b) * T:(i * B + b) * T + T + 1] for b in range(B)]
            batch = torch.from_numpy(np.stack(win))
            total += gpt2_loss(w, batch[:, :-1], batch[:, 1:], n_head, dtype)
        result[name] = total / n
    print(json.dumps(result))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
