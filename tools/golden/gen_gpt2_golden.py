#!/usr/bin/python3
"""Generate tests/data/gpt2_tiny_golden.bin: golden values for a tiny GPT-2 from PyTorch.

An independent GPT-2 written in plain PyTorch (no code shared with the C++ model) is
initialised in float32 with a fixed seed, converted to float64, and run on one random
batch. The file holds the float32 initial parameters, the tokens and targets, and the
float64 results rounded to float32: logits, mean loss, every parameter gradient, and
five AdamW steps (torch.optim.AdamW, clip_grad_norm_(1.0) before each step, same batch)
with the loss and pre-clip gradient norm of each step and the final parameters.

CI does not need PyTorch: the .bin is committed and read by tests/golden.h. Regenerate
(and re-verify) with Debian's interpreter, which has python3-torch and numpy:

    /usr/bin/python3 tools/golden/gen_gpt2_golden.py --check

--check adds: central finite differences of the loss against autograd for entries of all
16 parameter tensors, a second hand-written forward (layernorm, attention, GELU,
log-softmax) compared with the torch-builtin one, a hand-written AdamW (llm.c update
formula) compared with torch's, and a read-back of the written file.

Config: V=250, Vp=256, maxT=16, L=2, NH=3, C=72, B=3, T=13 (num_params 146016).
Format (little-endian; see tests/data/README.md):
  int32 header[256]: magic 20261121, version 1, B, T, V, Vp, maxT, L, NH, C, n_steps,
                     num_params, zeros
  int32 tokens[B*T], int32 targets[B*T]
  float32 params[num_params]                 (initial values, llm.c order)
  float32 logits[B*T*Vp], float32 loss[1], float32 grads[num_params]
  float32 step_losses[n_steps], float32 step_grad_norms[n_steps]
  float32 params_after[num_params]
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

MAGIC = 20261121
VERSION = 1
HEADER_INTS = 256

V, VP, MAXT, L, NH, C = 250, 256, 16, 2, 3, 72
B, T = 3, 13
N_STEPS = 5
SEED = 1234
LR, BETAS, EPS, WD, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0
LN_EPS = 1e-5

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}  # the 2-D weight matrices


def param_shapes():
    return {
        "wte": (VP, C), "wpe": (MAXT, C), "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C), "lnfw": (C,), "lnfb": (C,),
    }


def init_params():
    """float32 initial parameters, drawn in llm.c order from torch.manual_seed(SEED)."""
    torch.manual_seed(SEED)
    shapes = param_shapes()
    proj_std = 0.02 / math.sqrt(2 * L)
    p = {}
    for name in NAMES:
        shape = shapes[name]
        r = torch.randn(shape, dtype=torch.float32)
        if name in ("attprojw", "fcprojw"):
            t = r * proj_std
        elif name in ("ln1w", "ln2w", "lnfw"):
            t = 1.0 + r * 0.1
        else:  # other weights, wpe and all biases (layernorm biases included)
            t = r * 0.02
        p[name] = t.to(torch.float32)
    p["wte"][V:] = 0.0  # padded vocabulary rows
    tokens = torch.randint(0, V, (B, T), dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), dtype=torch.int64)
    return p, tokens, targets


def forward(p, tokens, targets):
    """GPT-2 forward with torch builtins. Returns (logits (B,T,Vp), mean loss)."""
    Bq, Tq = tokens.shape
    hs = C // NH
    x = p["wte"][tokens] + p["wpe"][:Tq]
    causal = torch.ones(Tq, Tq, dtype=torch.bool).tril()
    for l in range(L):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], LN_EPS)
        qkv = F.linear(h, p["qkvw"][l], p["qkvb"][l])  # (B,T,3C)
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(Bq, Tq, NH, hs).transpose(1, 2)  # head h = columns h*hs..(h+1)*hs
        k = k.view(Bq, Tq, NH, hs).transpose(1, 2)
        v = v.view(Bq, Tq, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bq, Tq, C)
        x = x + F.linear(y, p["attprojw"][l], p["attprojb"][l])
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], LN_EPS)
        h = F.gelu(F.linear(h, p["fcw"][l], p["fcb"][l]), approximate="tanh")
        x = x + F.linear(h, p["fcprojw"][l], p["fcprojb"][l])
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], LN_EPS)
    logits = x @ p["wte"].T  # tied head over the padded vocabulary
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))
    return logits, loss


def forward_manual(p, tokens, targets):
    """The same model with every nonlinearity written out (check of forward())."""
    Bq, Tq = tokens.shape
    hs = C // NH

    def ln(x, w, b):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased
        return (x - mu) / torch.sqrt(var + LN_EPS) * w + b

    def gelu(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    x = p["wte"][tokens] + p["wpe"][:Tq]
    for l in range(L):
        h = ln(x, p["ln1w"][l], p["ln1b"][l])
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]
        y = torch.empty(Bq, Tq, C, dtype=x.dtype)
        for hd in range(NH):
            q = qkv[..., hd * hs:(hd + 1) * hs]
            k = qkv[..., C + hd * hs:C + (hd + 1) * hs]
            v = qkv[..., 2 * C + hd * hs:2 * C + (hd + 1) * hs]
            s = q @ k.transpose(-2, -1) / math.sqrt(hs)
            s = s + torch.triu(torch.full((Tq, Tq), -1e300, dtype=x.dtype), 1)
            e = torch.exp(s - s.max(-1, keepdim=True).values)
            y[..., hd * hs:(hd + 1) * hs] = (e / e.sum(-1, keepdim=True)) @ v
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = ln(x, p["ln2w"][l], p["ln2b"][l])
        h = gelu(h @ p["fcw"][l].T + p["fcb"][l])
        x = x + h @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = ln(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"].T
    z = logits[..., :V]
    lse = torch.log(torch.exp(z - z.max(-1, keepdim=True).values).sum(-1)) + z.max(-1).values
    nll = lse - z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logits, nll.mean()


def flat(d):
    return np.concatenate([d[n].detach().reshape(-1).numpy() for n in NAMES])


def train(p0, tokens, targets):
    """N_STEPS of clip + torch AdamW in float64. Returns (losses, norms, params after)."""
    p = {n: torch.nn.Parameter(p0[n].clone()) for n in NAMES}
    opt = torch.optim.AdamW(
        [{"params": [p[n] for n in NAMES if n in DECAYED], "weight_decay": WD},
         {"params": [p[n] for n in NAMES if n not in DECAYED], "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS, foreach=False)
    losses, norms = [], []
    for _ in range(N_STEPS):
        opt.zero_grad(set_to_none=True)
        _, loss = forward(p, tokens, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([p[n] for n in NAMES], CLIP)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms, p


def train_manual(p0, tokens, targets, torch_clip):
    """llm.c-style AdamW written out: decoupled decay, m/(sqrt(v)+eps) on bias-corrected
    moments. torch_clip: scale by min(1, clip/(norm+1e-6)) as clip_grad_norm_ does;
    otherwise clip/norm when norm > clip (llm.c)."""
    p = {n: p0[n].clone() for n in NAMES}
    m = {n: torch.zeros_like(p[n]) for n in NAMES}
    v = {n: torch.zeros_like(p[n]) for n in NAMES}
    losses, norms = [], []
    for t in range(1, N_STEPS + 1):
        leaves = {n: p[n].clone().requires_grad_(True) for n in NAMES}
        _, loss = forward(leaves, tokens, targets)
        loss.backward()
        g = {n: leaves[n].grad for n in NAMES}
        norm = math.sqrt(sum(float((g[n] ** 2).sum()) for n in NAMES))
        if torch_clip:
            scale = min(1.0, CLIP / (norm + 1e-6))
        else:
            scale = CLIP / norm if norm > CLIP else 1.0
        for n in NAMES:
            gn = g[n] * scale
            m[n] = BETAS[0] * m[n] + (1 - BETAS[0]) * gn
            v[n] = BETAS[1] * v[n] + (1 - BETAS[1]) * gn * gn
            mhat = m[n] / (1 - BETAS[0] ** t)
            vhat = v[n] / (1 - BETAS[1] ** t)
            wd = WD if n in DECAYED else 0.0
            p[n] = p[n] - LR * (mhat / (torch.sqrt(vhat) + EPS) + wd * p[n])
        losses.append(loss.item())
        norms.append(norm)
    return losses, norms, p


def finite_difference_check(p64, tokens, targets, grads):
    """Central differences of the float64 loss against autograd, 4 entries per tensor
    (3 random + the largest |grad|). Returns the worst relative error."""
    gen = np.random.default_rng(7)
    h = 1e-5
    worst = 0.0
    for n in NAMES:
        g = grads[n].reshape(-1)
        idx = list(gen.choice(g.numel(), size=3, replace=False)) + [int(g.abs().argmax())]
        if n == "wte":
            idx.append(V * C + 5)  # a padded row: gradient must be exactly 0
        for i in idx:
            i = int(i)
            q = {k: t.clone() for k, t in p64.items()}
            base = q[n].reshape(-1)[i].item()
            q[n].view(-1)[i] = base + h
            lp = forward(q, tokens, targets)[1].item()
            q[n].view(-1)[i] = base - h
            lm = forward(q, tokens, targets)[1].item()
            fd = (lp - lm) / (2 * h)
            ad = g[i].item()
            err = abs(fd - ad) / max(abs(ad), 1e-4)
            worst = max(worst, err)
            print(f"  {n:9s}[{i:6d}] autograd {ad:+.10e}  fd {fd:+.10e}  rel {err:.1e}")
            if n == "wte" and i >= V * C:
                assert ad == 0.0, "padded wte row got gradient"
    return worst


def write(path, tokens, targets, params, logits, loss, grads, step_losses, step_norms,
          params_after):
    num_params = params.size
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:12] = [MAGIC, VERSION, B, T, V, VP, MAXT, L, NH, C, N_STEPS, num_params]
    parts = [header, tokens.astype("<i4"), targets.astype("<i4"), params.astype("<f4"),
             logits.astype("<f4"), np.array([loss], dtype="<f4"), grads.astype("<f4"),
             np.asarray(step_losses, dtype="<f4"), np.asarray(step_norms, dtype="<f4"),
             params_after.astype("<f4")]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        for a in parts:
            f.write(np.ascontiguousarray(a).tobytes())


def read(path):
    raw = open(path, "rb").read()
    header = np.frombuffer(raw, dtype="<i4", count=HEADER_INTS)
    b, t, vp, n_steps, n = header[2], header[3], header[5], header[10], header[11]
    counts = [("tokens", "<i4", b * t), ("targets", "<i4", b * t), ("params", "<f4", n),
              ("logits", "<f4", b * t * vp), ("loss", "<f4", 1), ("grads", "<f4", n),
              ("step_losses", "<f4", n_steps), ("step_grad_norms", "<f4", n_steps),
              ("params_after", "<f4", n)]
    expect = 4 * (HEADER_INTS + sum(c for _, _, c in counts))
    assert len(raw) == expect, f"{path}: {len(raw)} bytes, header implies {expect}"
    off, out = 4 * HEADER_INTS, {"header": header}
    for name, dt, cnt in counts:
        out[name] = np.frombuffer(raw, dtype=dt, count=int(cnt), offset=off)
        off += 4 * int(cnt)
    return out


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(repo, "tests", "data", "gpt2_tiny_golden.bin"))
    ap.add_argument("--check", action="store_true", help="run the self-checks as well")
    args = ap.parse_args()

    torch.set_num_threads(1)  # fixed reduction order: reproducible float64 results
    p32, tokens, targets = init_params()
    params = flat(p32)
    num_params = params.size
    assert num_params == 146016, num_params
    assert params.dtype == np.float32

    p64 = {n: p32[n].to(torch.float64) for n in NAMES}
    leaves = {n: p64[n].clone().requires_grad_(True) for n in NAMES}
    logits, loss = forward(leaves, tokens, targets)
    loss.backward()
    grads = {n: leaves[n].grad.detach() for n in NAMES}
    assert float(grads["wte"][V:].abs().max()) == 0.0
    assert float(logits[..., V:].abs().max()) == 0.0

    step_losses, step_norms, p_after = train(p64, tokens, targets)
    assert abs(step_losses[0] - loss.item()) < 1e-12

    write(args.out, tokens.reshape(-1).numpy(), targets.reshape(-1).numpy(), params,
          logits.detach().numpy(), loss.item(), flat(grads), step_losses, step_norms,
          flat(p_after))
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {size} bytes, num_params {num_params}")
    print(f"loss {loss.item():.10f}  (ln V = {math.log(V):.6f})")
    print("step losses    " + " ".join(f"{x:.8f}" for x in step_losses))
    print("step grad norm " + " ".join(f"{x:.8f}" for x in step_norms))
    assert size < 2 * 1024 * 1024

    if not args.check:
        return 0

    print("check: read-back")
    r = read(args.out)
    assert list(r["header"][:12]) == [MAGIC, VERSION, B, T, V, VP, MAXT, L, NH, C, N_STEPS,
                                      num_params]
    assert not r["header"][12:].any()
    assert (r["tokens"] == tokens.reshape(-1).numpy()).all()
    assert (r["targets"] == targets.reshape(-1).numpy()).all()
    assert (r["params"] == params).all()
    assert (r["grads"] == flat(grads).astype(np.float32)).all()
    assert (r["params_after"] == flat(p_after).astype(np.float32)).all()
    assert r["loss"][0] == np.float32(loss.item())

    print("check: hand-written forward vs builtin forward")
    logits_m, loss_m = forward_manual(p64, tokens, targets)
    dl = float((logits_m - logits.detach()).abs().max())
    print(f"  max |logits diff| {dl:.2e}, |loss diff| {abs(loss_m.item() - loss.item()):.2e}")
    assert dl < 1e-12 and abs(loss_m.item() - loss.item()) < 1e-12

    print("check: finite differences (float64, h=1e-5)")
    worst = finite_difference_check(p64, tokens, targets, grads)
    print(f"  worst relative error {worst:.2e}")
    assert worst < 1e-6, worst

    print("check: hand-written AdamW vs torch.optim.AdamW")
    for torch_clip in (True, False):
        ml, mn, mp = train_manual(p64, tokens, targets, torch_clip)
        dp = max(float((mp[n] - p_after[n].detach()).abs().max()) for n in NAMES)
        dlos = max(abs(a - b) for a, b in zip(ml, step_losses))
        dn = max(abs(a - b) for a, b in zip(mn, step_norms))
        label = "clip min(1, c/(n+1e-6)) [torch]" if torch_clip else "clip c/n if n>c [llm.c]"
        print(f"  {label}: max |params diff| {dp:.2e}, |loss diff| {dlos:.2e}, "
              f"|norm diff| {dn:.2e}")
        if torch_clip:
            assert dp < 1e-12 and dlos < 1e-12 and dn < 1e-12
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
