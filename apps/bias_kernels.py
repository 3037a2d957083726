#!/usr/bin/env python3
"""Qiu & Yao's tied-maximum bias in production attention kernels (issue 44, item 4).

    python3 apps/bias_kernels.py --device cuda|cpu [--rows N] [--ties 2,3,5] [--seed S]
        [--out DIR] [--attn-deviation PATH] [--time-limit SECONDS] [--kernels LIST] ...

Feeds the same kind of inputs as `attn_deviation bias` (attention/experiments.cpp: rows whose
scores are chosen exactly; k tied maxima at --top inside one key tile of --block-k keys, the
other keys --top - U(--gap-lo, --gap-hi); untied control rows with one maximum; V ~ --v in
BF16) to
  PyTorch's SDPA backends (flash, efficient, cudnn, math; --device cuda; on the CPU only
    math), in BF16, each forced alone (torch.nn.attention.sdpa_kernel, or
    torch.backends.cuda.sdp_kernel on older PyTorch); a backend that refuses the inputs is
    reported as "not available: <reason>";
  our backends through the trainer's path (`attn_deviation apply`: make_backend ->
    make_attention -> forward): baseline, flash, stabilized flash (beta 2), each flash with
    the FP32 accumulator (the gpu rule, the default) and with the BF16 one (the paper's
    implementation: attention.accum bf16), the Hopper flash kernel (cuda_kernel sm90) on the
    GPU, and cudnn (GPU only);
and reports, per kernel x row kind x tie count, the mean signed error of the stored O against
an FP64 reference (mean over the row's outputs, then over rows), its standard error, the
ratio to the untied rows' error, and the excess over the exact O rounded once to BF16 (paired
per row): a kernel that rounds O correctly has excess 0 whatever the rows. Qiu & Yao's bias is
an excess along sign(V) on tied rows only.

How exact scores reach every kernel through Q and K (tests/attention_test_util.h's
stats_inputs, one column pair per query row): head dim d = 64; query row t uses the column
pair j = t mod 32, q_t = e_2j + e_2j+1; key s holds, in pair j, X = hi + lo with
hi = bf16(X), lo = X - hi, X = 8 * score rounded to 16 significant bits, so q_t . k_s = X
exactly in any summation order (two nonzero products, their sum exact in FP32) and
scale * X = score exactly (scale = 1/8, the default of SDPA and of our kernels). So 32
distinct rows per (batch, head) sequence; rows t >= 32 repeat them and are not counted.
A sequence's rows share its V, so the standard error is taken over sequences (as the lab
takes it over head calls); the SE over rows is in the CSV too.

--device cpu is the dry run: our CPU backends and PyTorch's math path on the CPU (with
PyTorch < 2.0, which has no SDPA, an explicit composition identical to SDPA's math backend in
BF16: q*sqrt(s), k*sqrt(s), matmul, softmax, matmul). Both modes cross-check the inputs: the
FP64 reference computed here against the lab's FP64 baseline (`attn_deviation apply
--compute fp64`) on the first round's rows (exit status 3 if they differ), and our CPU
kernels' (or, on the GPU, our GPU kernels') figures against `attn_deviation bias` on the same
distribution with independent draws (a z per series; flagged, not fatal).

Writes DIR/bias_kernels.md (settings, input distribution, tables, the command), .csv and
.json. Needs numpy; torch is optional (without it the torch rows say so). The inputs and the
kernels are in apps/bias_kernels_lib.py; this file holds the statistics, the report and main.
"""
import argparse
import csv
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:  # pragma: no cover
    print("bias_kernels: numpy is required (Debian: apt-get install python3-numpy)", file=sys.stderr)
    sys.exit(2)

from bias_kernels_lib import (D, R, REPO, Round, Stop, bf16, dist_mean, our_kernels, parse_dist,  # noqa: E402
                              reference_kernel, torch_kernels)


# ----------------------------------------------------------------- statistics

def stats(arrs):
    """mean, SE over sequences, SE over rows, mean |.|, rows, sequences, nonfinite rows of a
    list of (nseq, R) per-row arrays."""
    x = np.concatenate(arrs, axis=0) if arrs else np.zeros((0, R))
    fin = np.isfinite(x)
    n = int(fin.sum())
    bad = int(x.size - n)
    if n == 0:
        return dict(mean=float("nan"), se=float("nan"), se_rows=float("nan"), mean_abs=float("nan"),
                    rows=0, sequences=int(x.shape[0]), nonfinite=bad)
    xf = np.where(fin, x, 0.0)
    mean = xf.sum() / n
    se_rows = math.sqrt(((xf - mean) ** 2 * fin).sum() / (n - 1) / n) if n > 1 else float("nan")
    cnt = fin.sum(axis=1)
    seq = (xf.sum(axis=1)[cnt > 0] / cnt[cnt > 0])
    se = float(seq.std(ddof=1) / math.sqrt(len(seq))) if len(seq) > 1 else float("nan")
    return dict(mean=float(mean), se=se, se_rows=se_rows, mean_abs=float(np.abs(xf).sum() / n),
                rows=n, sequences=int(x.shape[0]), nonfinite=bad)


def ratio(m1, s1, m2, s2):
    if m2 == 0 or not np.isfinite(m2):
        return float("nan"), float("nan")
    r = m1 / m2
    rel = (s1 / m1) ** 2 if m1 else 0.0
    rel += (s2 / m2) ** 2
    return r, abs(r) * math.sqrt(rel)


def z_of(m, s):
    return m / s if s and np.isfinite(s) and s > 0 else float("nan")


# ----------------------------------------------------------------- cross-checks

def lab_fp64_check(a, rd):
    """The FP64 reference against the lab's FP64 baseline on the same file: max |diff|."""
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        inp, out = os.path.join(tmp, "qkv.bin"), os.path.join(tmp, "o.bin")
        rd.bits.tofile(inp)
        cmd = [a.attn_deviation, "apply", "--qkv", inp, "--B", str(rd.B), "--T", str(rd.T),
               "--NH", str(rd.NH), "--hs", str(D), "--backend", "baseline", "--device", "cpu",
               "--compute", "fp64", "--out", out]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            return None, (p.stderr.strip().splitlines() or ["failed"])[-1]
        o = np.fromfile(out, dtype=np.float64).reshape(rd.B, rd.T, rd.NH * D)
    lab = rd.rows_of(o)
    return float(np.max(np.abs(lab - rd.ref))), " ".join(shlex.quote(c) for c in cmd)


def lab_bias(a, ties, rows):
    """attn_deviation bias on the same distribution: {(kind, accum, backend): (mean, se, rows)}."""
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        csv_path = os.path.join(tmp, "lab.csv")
        cmd = [a.attn_deviation, "bias", "--rows", str(rows), "--rows-per-call", str(R),
               "--keys", str(a.keys), "--d", str(D), "--block-k", str(a.block_k), "--ties", str(ties),
               "--top", repr(a.top), "--gap-lo", repr(a.gap_lo), "--gap-hi", repr(a.gap_hi),
               "--v", a.v, "--kinds", "tied_tile,single", "--accums", "bf16_accum,fp32_accum",
               "--betas", "2", "--no-deltas", "--seed", str(a.seed), "--csv", csv_path]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError((p.stderr.strip().splitlines() or ["failed"])[-1])
        out = {}
        with open(csv_path) as f:
            for r in csv.DictReader(f):
                if r["quantity"] != "o":
                    continue
                out[(r["kind"], r["accum"], r["backend"])] = (float(r["mean"]), float(r["se"]), int(r["rows"]))
    shown = [c if c != csv_path else "LAB.csv" for c in cmd]
    return out, " ".join(shlex.quote(c) for c in shown)


# ----------------------------------------------------------------- output

def fmt_e(x, digits=2):
    return "nan" if x is None or not np.isfinite(x) else f"{x:+.{digits}e}"


def fmt_se(x):
    return "nan" if x is None or not np.isfinite(x) else f"{x:.1e}"


def fmt_z(x):
    return "-" if x is None or not np.isfinite(x) else f"{x:+.1f}"


def git_commit():
    try:
        c = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return c + (" (with uncommitted changes)" if dirty else "") if c else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.node()} ({platform.machine()}, {os.cpu_count()} logical CPUs{', ' + cpu if cpu else ''})"


def verdict(zf, ze, vsign):
    """Does a kernel carry Qiu & Yao's bias? zf: z of the tied rows' error against FP64, ze: z
    of their excess over the correctly rounded O, one per tie count."""
    pairs = [(f, e) for f, e in zip(zf, ze) if np.isfinite(f) and np.isfinite(e)]
    if not pairs:
        return "-"
    if any(f * vsign >= 5 and e * vsign >= 5 for f, e in pairs):
        return "**yes**: tied rows >= 5 SE along sign(V), against FP64 and beyond the rounded O"
    if all(abs(e) < 3 for f, e in pairs):
        return "no: as the correctly rounded O (excess within 3 SE)"
    if all(f * vsign < 3 for f, e in pairs):
        return "no bias along sign(V) against FP64; its O differs from the correctly rounded one"
    return "unclear: along sign(V) against FP64 but not beyond the rounded O by 5 SE"


def report(a, kernels, kinds, rounds_done, rounds_total, wall, torch_desc, checks, load0, stopped):
    vsign = 1.0 if dist_mean(a.vdist) > 0 else -1.0
    ui = len(kinds) - 1  # the untied kind is last
    rows_out = []
    for k in kernels:
        if k.unavailable is not None:
            rows_out.append(dict(kernel=k.id, source=k.source, label=k.label, accum=k.accum, kind="",
                                 ties="", status="not available: " + k.unavailable))
            continue
        su = stats(k.errs.get(ui, []))
        eu = stats(k.exc.get(ui, []))
        for ki, (kind, ties) in enumerate(kinds):
            s = stats(k.errs.get(ki, []))
            e = stats(k.exc.get(ki, []))
            r, rse = ratio(s["mean"], s["se"], su["mean"], su["se"]) if ki != ui else (1.0, 0.0)
            rows_out.append(dict(kernel=k.id, source=k.source, label=k.label, accum=k.accum, kind=kind,
                                 ties=ties if kind == "tied" else 1, status="ok",
                                 rows=s["rows"], sequences=s["sequences"], nonfinite=s["nonfinite"],
                                 mean=s["mean"], se=s["se"], se_rows=s["se_rows"], z=z_of(s["mean"], s["se"]),
                                 mean_abs=s["mean_abs"], ratio_untied=r, ratio_se=rse,
                                 excess=e["mean"], excess_se=e["se"], excess_z=z_of(e["mean"], e["se"]),
                                 excess_untied_diff=e["mean"] - eu["mean"] if ki != ui else 0.0,
                                 seconds=k.seconds))
    cmdline = "python3 apps/bias_kernels.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    ties_txt = ", ".join(str(t) for (kd, t) in kinds if kd == "tied")
    nseq = a.m * a.heads * rounds_done
    L = []
    L.append("# Qiu & Yao's tied-maximum bias in production attention kernels\n")
    L.append(f"Command (regenerates this file): `{cmdline}`\n")
    L.append(f"- Date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; machine {machine()}; load average "
             f"{load0} at start, {' '.join(f'{x:.2f}' for x in os.getloadavg())} at end; "
             f"wall {wall:.1f} s.")
    L.append(f"- Commit {git_commit()}; numpy {np.__version__}; {torch_desc}; "
             f"attn_deviation `{a.attn_deviation}`.")
    if stopped:
        L.append(f"- **Stopped by --time-limit {a.time_limit:g} s after {rounds_done} of {rounds_total} "
                 f"rounds**: the figures are those rounds' rows (every kernel saw the same ones).")
    if rounds_done == 0:
        L.append("- **No round finished within the time limit: no figures.** Raise --time-limit or "
                 "lower --rows / raise --rounds (smaller rounds).")
    L.append("")
    L.append("## Settings and input distribution\n")
    L.append(f"- Device {a.device}; BF16 inputs and stored O; head dim {D}, {a.keys} keys per row, "
             f"non-causal, scale 1/sqrt({D}) = 1/8 (every kernel's default).")
    L.append(f"- Rows: {nseq} sequences (batch x head) per row kind, {R} measured query rows each = "
             f"{nseq * R} rows per kind; kinds: tied rows with {ties_txt} ties, and untied control "
             f"rows. {rounds_done} round(s) of {a.m} batch elements x {a.heads} heads per kind; seed {a.seed}.")
    L.append(f"- Scores (as `attn_deviation bias`, attention/experiments.cpp): tied rows have k maxima "
             f"at {a.top:g} inside one key tile of {a.block_k} keys (the tile uniform among the row's "
             f"tiles, the positions uniform in it), every other key {a.top:g} - U({a.gap_lo:g}, "
             f"{a.gap_hi:g}); untied rows one maximum at {a.top:g} at a uniform position.")
    L.append(f"- How the scores enter: query row t is e_2j + e_2j+1 (j = t mod {R}); key s holds in "
             f"columns 2j, 2j+1 the BF16 pair hi + lo = X, X = 8 x score rounded to 16 significant "
             f"bits, so q.k = X exactly in any order and the scaled score is X/8 exactly. Rows t >= {R} "
             f"repeat rows t mod {R} and are not counted.")
    L.append(f"- V ~ {a.v} rounded to BF16, drawn per sequence ({a.keys} x {D}) and shared by its "
             f"{R} rows (mean {dist_mean(a.vdist):+g}: Qiu & Yao's bias points along sign(V) = "
             f"{'+' if vsign > 0 else '-'}).")
    L.append("- Reference: FP64 softmax((q.k)/8) V from the BF16 inputs (numpy). Error of a row = "
             "mean over its 64 outputs of (O - O_ref); mean over rows; **SE over sequences** (a "
             "sequence's rows share V; the lab takes its SE over head calls for the same reason); "
             "the SE over rows is the CSV's se_rows.")
    ratios = [stats(k.errs[ki])["se"] / stats(k.errs[ki])["se_rows"] for k in kernels
              if k.unavailable is None for ki in k.errs if stats(k.errs[ki])["se_rows"] > 0]
    if ratios:
        L.append(f"- SE over sequences / SE over rows = {min(ratios):.2f} to {max(ratios):.2f} in "
                 f"this run{': the rows behave as independent' if 0.8 < min(ratios) and max(ratios) < 1.25 else ''}.")
    L.append("- Ratio to untied = mean(tied) / mean(untied) (delta-method SE). Excess = O - "
             "bf16(O_ref), the error beyond rounding the exact O once, paired per row: 0 for a "
             "kernel whose stored O is correctly rounded. Qiu & Yao's bias is a tied-row excess "
             "along sign(V).")
    L.append(f"- Differences from `attn_deviation bias`: head dim {D} (its default 32), {R} rows per "
             f"sequence (its default 64 per call), X rounded to 16 significant bits before the hi/lo "
             f"split (there X's split is of the unrounded value; the top score {a.top:g} is exact in "
             f"both), numpy's generator (the draws differ; the distribution is the same).")
    L.append("")

    # summary
    tied_kinds = [(ki, t) for ki, (kd, t) in enumerate(kinds) if kd == "tied"]
    L.append("## Which kernels carry the bias\n")
    L.append("Per row kind: mean signed error against FP64 (z = mean / SE) / excess over the "
             "correctly rounded O (z). Verdict from the tied rows: yes = for some tie count both "
             "are >= 5 SE along sign(V). Both, because the exact O rounded once (first row) has "
             "an error of its own on tied rows, which no BF16 output can avoid; the excess alone "
             "would call a kernel that is unbiased against FP64 biased whenever that floor is.\n")
    L.append("| kernel | accumulator | " + " | ".join(f"{t} ties" for _, t in tied_kinds) +
             " | untied | verdict |")
    L.append("|---|---|" + "---|" * (len(tied_kinds) + 2))
    for k in kernels:
        if k.unavailable is not None:
            L.append(f"| {k.label} | {k.accum} | " + " | ".join("-" for _ in tied_kinds) +
                     f" | - | not available: {k.unavailable} |")
            continue
        cells, zf, ze = [], [], []
        for ki, _ in tied_kinds + [(ui, 0)]:
            s = stats(k.errs.get(ki, []))
            e = stats(k.exc.get(ki, []))
            z1, z2 = z_of(s["mean"], s["se"]), z_of(e["mean"], e["se"])
            if ki != ui:
                zf.append(z1)
                ze.append(z2)
            cells.append(f"{fmt_e(s['mean'])} ({fmt_z(z1)}) / {fmt_e(e['mean'])} ({fmt_z(z2)})")
        v = "reference (the floor of any BF16 O)" if k.source == "reference" else verdict(zf, ze, vsign)
        L.append(f"| {k.label} | {k.accum} | " + " | ".join(cells) + f" | {v} |")
    L.append("")

    L.append("## Mean signed error of O against FP64\n")
    L.append("| kernel | rows | n rows | mean ± SE | z | ratio to untied ± SE | excess ± SE | z | mean abs err |")
    L.append("|---|---|--:|---|--:|---|---|--:|--:|")
    for r in rows_out:
        if r["status"] != "ok" or r["rows"] == 0:
            continue
        label = next(k.label for k in kernels if k.id == r["kernel"])
        kind = f"{r['ties']} ties" if r["kind"] == "tied" else "untied"
        rat = "1" if r["kind"] == "untied" else f"{r['ratio_untied']:.3g} ± {fmt_se(r['ratio_se'])}"
        bad = f" ({r['nonfinite']} non-finite)" if r["nonfinite"] else ""
        L.append(f"| {label} | {kind} | {r['rows']}{bad} | {fmt_e(r['mean'])} ± {fmt_se(r['se'])} | "
                 f"{fmt_z(r['z'])} | {rat} | {fmt_e(r['excess'])} ± {fmt_se(r['excess_se'])} | "
                 f"{fmt_z(r['excess_z'])} | {r['mean_abs']:.2e} |")
    L.append("")
    na = [k for k in kernels if k.unavailable is not None]
    if na:
        L.append("## Not available\n")
        for k in na:
            L.append(f"- {k.label} (`{k.id}`): not available: {k.unavailable}")
        L.append("")
    L.append("## Cross-checks of the inputs\n")
    fc = checks.get("fp64")
    if fc:
        L.append(f"- FP64 reference (numpy, this script) against the lab's FP64 baseline on round 0's "
                 f"{fc['rows']} rows (`attn_deviation apply --backend baseline --compute fp64`): max "
                 f"|diff| = {fc['max_abs_diff']:.3g} (pass: <= {fc['tol']:g}) -> "
                 f"**{'pass' if fc['pass'] else 'FAIL'}**.")
    lb = checks.get("lab_bias")
    if lb:
        L.append(f"- Against `attn_deviation bias` on the same distribution (independent draws, "
                 f"{lb['rows_per_kind']} rows per kind, SE over calls of {R} rows): z = (ours - lab) / "
                 f"sqrt(SE_ours^2 + SE_lab^2); |z| >= 4 is flagged. Commands: " +
                 "; ".join(f"`{c}`" for c in lb["commands"]))
        L.append("")
        L.append("| kernel | rows | ours mean ± SE | lab mean ± SE | z | |")
        L.append("|---|---|---|---|--:|---|")
        for c in lb["comparisons"]:
            L.append(f"| {c['kernel']} | {c['kind_label']} | {fmt_e(c['ours'])} ± {fmt_se(c['ours_se'])} | "
                     f"{fmt_e(c['lab'])} ± {fmt_se(c['lab_se'])} | {fmt_z(c['z'])} | "
                     f"{'' if abs(c['z']) < 4 else 'DIFFERS'} |")
    elif checks.get("lab_bias_error"):
        L.append(f"- `attn_deviation bias` cross-check failed to run: {checks['lab_bias_error']}")
    L.append("")
    text = "\n".join(L)

    os.makedirs(a.out, exist_ok=True)
    md = os.path.join(a.out, "bias_kernels.md")
    with open(md, "w") as f:
        f.write(text)
    cols = ["kernel", "source", "label", "accum", "kind", "ties", "status", "rows", "sequences",
            "nonfinite", "mean", "se", "se_rows", "z", "mean_abs", "ratio_untied", "ratio_se",
            "excess", "excess_se", "excess_z", "excess_untied_diff", "seconds"]
    with open(os.path.join(a.out, "bias_kernels.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows_out:
            w.writerow({c: r.get(c, "") for c in cols})
    meta = dict(command=cmdline, date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), machine=machine(),
                load_average_start=load0, load_average_end=os.getloadavg()[0], wall_seconds=wall,
                commit=git_commit(), numpy=np.__version__, torch=torch_desc,
                settings=dict(device=a.device, d=D, rows_per_sequence=R, keys=a.keys, block_k=a.block_k,
                              ties=[t for kd, t in kinds if kd == "tied"], top=a.top, gap_lo=a.gap_lo,
                              gap_hi=a.gap_hi, v=a.v, seed=a.seed, heads=a.heads, batch_per_kind=a.m,
                              rounds_done=rounds_done, rounds_planned=rounds_total,
                              stopped_by_time_limit=stopped),
                columns={"mean": "mean over rows of the row's mean signed error of O (over its 64 outputs) vs FP64",
                         "se": "standard error of mean over sequences (rows of a sequence share V)",
                         "se_rows": "standard error of mean over rows, as if independent",
                         "excess": "mean of O - bf16(O_fp64): error beyond rounding the exact O once",
                         "ratio_untied": "mean / the untied rows' mean (delta-method SE ratio_se)",
                         "excess_untied_diff": "excess minus the untied rows' excess"},
                checks=checks, rows=rows_out)
    with open(os.path.join(a.out, "bias_kernels.json"), "w") as f:
        json.dump(meta, f, indent=1, default=float)
    return text


# ----------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], required=True,
                    help="cuda: torch SDPA's backends and ours on the GPU; cpu: the dry run")
    ap.add_argument("--rows", type=int, default=4096, help="measured rows per row kind (rounded up "
                    f"to whole rounds of batch x heads x {R})")
    ap.add_argument("--ties", default="2,3,5", help="tie counts of the tied rows")
    ap.add_argument("--keys", type=int, default=512, help="keys per row (= T)")
    ap.add_argument("--block-k", type=int, default=64, help="the key tile the ties share (and our "
                    "flash kernels' key tile)")
    ap.add_argument("--top", type=float, default=5.0)
    ap.add_argument("--gap-lo", type=float, default=12.0)
    ap.add_argument("--gap-hi", type=float, default=20.0)
    ap.add_argument("--v", default="normal:0.7:0.3", help="V distribution: normal:MEAN:STD | uniform:LO:HI")
    ap.add_argument("--heads", type=int, default=4, help="heads per batch element (sequences = B x heads)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds the rows are split into (the time "
                    "limit stops between rounds)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kernels", default="", help="comma list of kernel ids to run (default: all); "
                    "e.g. ours/flash+bf16acc,torch/math")
    ap.add_argument("--out", default="bias_kernels_out", help="output folder (bias_kernels.md/.csv/.json)")
    ap.add_argument("--attn-deviation", default=os.path.join("build", "bin", "attn_deviation"))
    ap.add_argument("--time-limit", type=float, default=0, help="seconds; stop cleanly between "
                    "rounds and write what is done (0: none)")
    ap.add_argument("--save-inputs", action="store_true", help="also write round 0's inputs "
                    "(round0_qkv.bin: raw bf16 (B, T, 3C)), its FP64 reference (round0_ref.npy: (B, "
                    "NH, rows, d)) and their shapes (round0.json) into --out")
    ap.add_argument("--no-lab-check", action="store_true", help="skip the attn_deviation bias cross-check")
    ap.add_argument("--lab-rows", type=int, default=0, help="rows per kind of the attn_deviation bias "
                    "cross-check (default: --rows)")
    a = ap.parse_args()
    t_start = time.monotonic()
    deadline = t_start + a.time_limit if a.time_limit > 0 else None
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    try:
        a.vdist = parse_dist(a.v)
        ties = [int(x) for x in a.ties.split(",") if x.strip()]
    except ValueError as e:
        ap.error(str(e))
    if not ties or any(t < 2 or t > min(a.block_k, a.keys) for t in ties):
        ap.error(f"--ties: each between 2 and min(--block-k, --keys) = {min(a.block_k, a.keys)}")
    if a.keys < R or a.rows < 1 or a.heads < 1 or a.rounds < 1 or a.block_k < 1:
        ap.error(f"--keys must be >= {R}; --rows, --heads, --rounds, --block-k >= 1")
    if not os.access(a.attn_deviation, os.X_OK):
        ap.error(f"--attn-deviation {a.attn_deviation}: not an executable (build it: cmake --build "
                 f"build --target attn_deviation)")
    kinds = [("tied", t) for t in ties] + [("untied", 1)]
    seqs = -(-a.rows // R)
    a.m = max(1, -(-seqs // (a.heads * a.rounds)))
    rounds_total = -(-seqs // (a.m * a.heads))
    os.makedirs(a.out, exist_ok=True)
    a.tmp = a.out

    kernels = [reference_kernel()] + our_kernels(a)
    tks, torch_desc = torch_kernels(a)
    kernels += tks
    if a.kernels:
        want = [x for x in a.kernels.split(",") if x]
        unknown = [x for x in want if x not in {k.id for k in kernels}]
        if unknown:
            ap.error(f"--kernels: unknown {', '.join(unknown)} (known: {', '.join(k.id for k in kernels)})")
        kernels = [k for k in kernels if k.id in want or k.id == "ref/fp64_rounded"]
    print(f"bias_kernels: {a.device}, {len(kinds)} row kinds x {rounds_total} rounds x {a.m * a.heads} "
          f"sequences x {R} rows; {len(kernels)} kernels; {torch_desc}", file=sys.stderr)

    checks = {}
    rounds_done, stopped = 0, False
    for ri in range(rounds_total):
        if deadline is not None and time.monotonic() >= deadline:
            stopped = True
            break
        rd = Round(a, kinds, ri)
        rounded = bf16(rd.ref)
        if ri == 0 and a.save_inputs:
            rd.bits.tofile(os.path.join(a.out, "round0_qkv.bin"))
            np.save(os.path.join(a.out, "round0_ref.npy"), rd.ref)
            with open(os.path.join(a.out, "round0.json"), "w") as f:
                json.dump(dict(B=rd.B, T=rd.T, NH=rd.NH, hs=D, rows=R, batch_per_kind=a.m,
                               kinds=[list(k) for k in kinds], block_k=a.block_k, top=a.top), f)
        if ri == 0:
            diff, cmd = lab_fp64_check(a, rd)
            tol = 1e-12
            checks["fp64"] = {"rows": int(rd.B * rd.NH * R), "tol": tol, "command": cmd,
                              "max_abs_diff": diff if diff is not None else float("nan"),
                              "pass": diff is not None and diff <= tol}
        results = {}
        try:
            for k in kernels:
                if k.unavailable is not None:
                    continue
                t0 = time.monotonic()
                if k.id == "ref/fp64_rounded":
                    o = rounded
                else:
                    try:
                        O = k.run(rd, deadline)
                    except Stop:
                        raise
                    except Exception as e:  # noqa: BLE001 -- any kernel failure is a table row
                        msg = str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"
                        msg = " ".join(msg.split())
                        k.unavailable = msg[len("not available: "):] if msg.startswith("not available: ") \
                            else "failed: " + msg
                        print(f"bias_kernels: {k.id}: {k.unavailable}", file=sys.stderr)
                        continue
                    o = rd.rows_of(O)
                results[k.id] = (o, time.monotonic() - t0)
                if deadline is not None and time.monotonic() >= deadline and k is not kernels[-1]:
                    raise Stop()
        except Stop:
            stopped = True
            break
        for k in kernels:
            if k.id not in results:
                continue
            o, secs = results[k.id]
            k.seconds += secs
            e = (o - rd.ref).mean(axis=-1)       # (B, NH, R)
            x = (o - rounded).mean(axis=-1)
            for ki in range(len(kinds)):
                sl = slice(ki * a.m, (ki + 1) * a.m)
                k.errs.setdefault(ki, []).append(e[sl].reshape(-1, R))
                k.exc.setdefault(ki, []).append(x[sl].reshape(-1, R))
        rounds_done += 1
        print(f"bias_kernels: round {ri + 1}/{rounds_total} done, {time.monotonic() - t_start:.1f} s",
              file=sys.stderr)

    if rounds_done and not a.no_lab_check:
        lab_rows = a.lab_rows or rounds_done * a.m * a.heads * R
        try:
            comp, cmds = [], []
            for ti, t in enumerate(ties):
                lab, cmd = lab_bias(a, t, lab_rows)
                cmds.append(cmd)
                for k in kernels:
                    if k.lab is None or k.unavailable is not None:
                        continue
                    for ki, lab_kind in ((ti, "tied_tile"), (len(kinds) - 1, "single")):
                        if lab_kind == "single" and ti > 0:
                            continue  # the untied rows are the same for every tie count
                        key = (lab_kind, k.lab[0], k.lab[1])
                        if key not in lab:
                            continue
                        s = stats(k.errs.get(ki, []))
                        lm, ls, lr = lab[key]
                        z = (s["mean"] - lm) / math.sqrt(s["se"] ** 2 + ls ** 2) if (s["se"] ** 2 + ls ** 2) > 0 else 0.0
                        comp.append(dict(kernel=k.id, lab_series=f"{k.lab[1]} {k.lab[0]}", kind=lab_kind, ties=t,
                                         kind_label=f"{t} ties" if lab_kind == "tied_tile" else "untied",
                                         ours=s["mean"], ours_se=s["se"], lab=lm, lab_se=ls, lab_rows=lr, z=z))
            checks["lab_bias"] = dict(rows_per_kind=lab_rows, commands=cmds, comparisons=comp,
                                      max_abs_z=max((abs(c["z"]) for c in comp), default=0.0))
        except (RuntimeError, OSError) as e:
            checks["lab_bias_error"] = str(e)

    wall = time.monotonic() - t_start
    text = report(a, kernels, kinds, rounds_done, rounds_total, wall, torch_desc, checks, load0, stopped)
    print(text)
    print(f"bias_kernels: wrote {a.out}/bias_kernels.md, .csv and .json", file=sys.stderr)
    if checks.get("fp64") and not checks["fp64"]["pass"]:
        print(f"bias_kernels: the FP64 reference differs from the lab's FP64 "
              f"(max |diff| {checks['fp64']['max_abs_diff']:.3g}): the inputs are not what this "
              f"script thinks", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
