#!/usr/bin/env python3
"""Tables for the Qiu & Yao reproduction study (docs/reproduction.md).

    python3 apps/repro_summary.py STUDY_DIR [STUDY_DIR ...] [--group-by KEY ...] [--json FILE]

Reads the run folders of one or more study folders (runs/<study>/<run>/, docs/run_files.md:
config.yaml, metrics.jsonl, spectral.csv, attn_stats.csv, delta_drift.csv, events.jsonl,
train.log) and prints, in Markdown, one row per run and one row per configuration (the runs
that differ only in run.seed), with these columns (definitions in docs/reproduction.md):

  steps      optimizer steps the run logged (fewer than train.max_steps: it stopped)
  explosion  first step whose 20-step mean training loss lies >= 0.5 nats above the lowest
             20-step mean before it, or the step of a non-finite loss; "none" otherwise
  spikes     steps the run's spike detector flagged (hooks.spike_z, events.jsonl)
  final loss mean training loss of the last 50 logged steps; val: the last validation loss
  grad norm  mean gradient norm (before clipping, train.grad_clip) of the last 50 logged steps
  sigma      spectral-norm growth: sigma_max(W_Q or W_K head slice) at the last hook step over
             its value at step 0, largest over layers and heads (which one in brackets)
  one-signed delta drift: |sum_k d_k| / sum_k |d_k| over the hook steps k of one head's
             delta_drift (1: every hook step's drift has the same sign), largest over heads,
             with the sign of that head's sum, its positive hook steps and the two-sided sign
             test's p (p = 1/2 per step; the most one-signed of several heads, so read it
             against the number of heads); med: the median over heads
  drift > 0  the fraction of all (layer, head, hook step) delta drifts that are positive
             (0.5 without a bias; Qiu & Yao's error is positive)
  |err|      delta_abs_err (sum over a hook step's rows of |delta_run - delta_fp64|), mean
             over heads and hook steps: the size of the delta error
  net        sum of every delta_drift over the sum of every delta_abs_err: the systematic
             share of the error (0 without a bias, +-1 when every row errs the same way)
  ties       tied_row_frac (rows whose maximum is tied within attention.tie_tol), mean over
             heads and hook steps, and the largest head mean

With --explosions, a third table: per configuration, the explosion step of every seed
("none": survived to its last step), the share that exploded with its exact (Clopper-Pearson)
95% interval, and Fisher's exact test (two-sided) of that share against the configuration
named by --reference (its label, or a substring of one label; default: the first); then the
delta error's systematic share (net) and share of positive drifts (drift > 0), each with an
exact two-sided permutation test of the difference in means against the reference.

With --timeline EVERY, per run, the order of events at every EVERY-th hook step: the 20-step
mean training loss and gradient norm ending at that step, the tie rate (tied_row_frac, mean
over heads), sigma_max of the W_Q slice of the top head (the head whose W_Q grew most by the
end) and the running sum of that head's delta drift.

Standard library only (no pandas). Every number is computed from the run files.
"""
import argparse
import csv
import json
import math
import os
import statistics
import sys

WINDOW = 20        # steps in the trailing mean of the explosion rule
JUMP = 0.5         # nats above the lowest earlier trailing mean
FINAL = 50         # steps averaged for the final training loss
IGNORE = {"run.seed", "run.name", "run.out_dir", "train.ckpt_every", "train.keep_checkpoints",
          "hooks.reference_run"}


def read_config(path):
    """train's config.yaml: two levels, 'section:' then '  key: value  # comment'."""
    cfg, section = {}, None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if not line.startswith(" "):
                section = line.split(":", 1)[0].strip()
                rest = line.split(":", 1)[1].split("#", 1)[0].strip()
                if rest:
                    cfg[section] = rest
                continue
            key, _, value = line.strip().partition(":")
            value = value.split(" #", 1)[0].strip().strip('"')
            cfg[f"{section}.{key.strip()}"] = value
    return cfg


def read_jsonl(path):
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    out.append(json.loads(line))
    return out


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def explosion_step(losses):
    """losses: [(step, loss)] in step order. See the module docstring."""
    best = math.inf
    window = []
    for step, loss in losses:
        if loss is None or not math.isfinite(loss):
            return step
        window.append(loss)
        if len(window) > WINDOW:
            window.pop(0)
        if len(window) == WINDOW:
            mean = sum(window) / WINDOW
            if mean >= best + JUMP:
                return step
            best = min(best, mean)
    return None


def sign_test(k, n):
    """Two-sided binomial sign test: P(at least as many same-signed steps | p = 1/2)."""
    m = max(k, n - k)
    tail = sum(math.comb(n, i) for i in range(m, n + 1)) / 2.0 ** n
    return min(1.0, 2 * tail)


def clopper_pearson(k, n, level=0.95):
    """Exact binomial interval for k successes in n trials (bisection on the beta tails)."""
    if n == 0:
        return (math.nan, math.nan)
    a = (1 - level) / 2

    def tail_ge(p):  # P(X >= k | p)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))

    def tail_le(p):  # P(X <= k | p)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))

    def solve(f, target, increasing):
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            if (f(mid) < target) == increasing:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(tail_ge, a, True)
    upper = 1.0 if k == n else solve(tail_le, a, False)
    return (lower, upper)


def fisher_exact(a, b, c, d):
    """Two-sided Fisher exact test of the 2x2 table [[a, b], [c, d]]: the summed probability
    of every table with the same margins no more likely than the observed one."""
    r1, c1, n = a + b, a + c, a + b + c + d

    def prob(x):
        return math.comb(r1, x) * math.comb(n - r1, c1 - x) / math.comb(n, c1)

    p_obs = prob(a)
    lo, hi = max(0, c1 - (n - r1)), min(r1, c1)
    return min(1.0, sum(prob(x) for x in range(lo, hi + 1) if prob(x) <= p_obs * (1 + 1e-9)))


def permutation_p(xs, ys):
    """Exact two-sided permutation test of the difference in means of xs and ys: the share of
    the splits of the pooled values into groups of their sizes whose |difference| is at least
    the observed one (with 3 and 3 values, 20 splits: p >= 0.1)."""
    import itertools
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    ys = [y for y in ys if y is not None and math.isfinite(y)]
    if not xs or not ys:
        return math.nan
    pool, n = xs + ys, len(xs)
    observed = abs(sum(xs) / n - sum(ys) / len(ys))
    total = hits = 0
    for idx in itertools.combinations(range(len(pool)), n):
        a = [pool[i] for i in idx]
        b = [pool[i] for i in range(len(pool)) if i not in idx]
        total += 1
        hits += abs(sum(a) / n - sum(b) / len(b)) >= observed * (1 - 1e-12)
    return hits / total


def summarise_run(run_dir):
    cfg = read_config(os.path.join(run_dir, "config.yaml"))
    metrics = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    train = [(m["step"], m["loss"]) for m in metrics if m.get("kind") == "train"]
    grads = [m.get("grad_norm") for m in metrics if m.get("kind") == "train"]
    evals = [m for m in metrics if m.get("kind") == "eval"]
    events = read_jsonl(os.path.join(run_dir, "events.jsonl"))
    r = {"run": os.path.basename(run_dir.rstrip("/")), "dir": run_dir, "config": cfg,
         "seed": cfg.get("run.seed"), "max_steps": int(cfg.get("train.max_steps", "0"))}
    r["steps"] = train[-1][0] if train else 0
    log = os.path.join(run_dir, "train.log")
    r["stopped"] = ""
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            for line in f:
                if "training loss is" in line or "non-finite gradients" in line:
                    r["stopped"] = line.strip().split("] ", 1)[-1][:200]
    r["train"] = train
    r["grads"] = [(m["step"], m.get("grad_norm")) for m in metrics if m.get("kind") == "train"]
    r["explosion"] = explosion_step(train)
    if r["explosion"] is None and r["stopped"]:
        r["explosion"] = r["steps"] + 1
    r["spikes"] = len({e.get("step") for e in events if e.get("event") == "spike"})
    tail = [l for _, l in train[-FINAL:] if l is not None and math.isfinite(l)]
    r["final_loss"] = sum(tail) / len(tail) if tail else math.nan
    gtail = [g for g in grads[-FINAL:] if g is not None and math.isfinite(g)]
    r["final_grad_norm"] = sum(gtail) / len(gtail) if gtail else math.nan
    r["val_loss"] = evals[-1].get("val_loss", math.nan) if evals else math.nan
    if r["val_loss"] is None:
        r["val_loss"] = math.nan

    # Spectral growth of the per-head W_Q / W_K slices.
    first, last = {}, {}
    for row in read_csv(os.path.join(run_dir, "spectral.csv")):
        if row["matrix"] not in ("wq", "wk"):
            continue
        key = (row["matrix"], int(row["layer"]), int(row["head"]))
        step, sigma = int(row["step"]), float(row["sigma"])
        if step == 0:
            first[key] = sigma
        if key not in last or step >= last[key][0]:
            last[key] = (step, sigma)
        r.setdefault("sigma_series", {}).setdefault(key, []).append((step, sigma))
    growth = {k: last[k][1] / first[k] for k in first if k in last and first[k] > 0}
    wq = {k: g for k, g in growth.items() if k[0] == "wq"}
    r["top_wq"] = max(wq, key=wq.get) if wq else None
    if growth:
        k = max(growth, key=growth.get)
        r["sigma_growth"], r["sigma_where"] = growth[k], f"{k[0]} L{k[1]}H{k[2]}"
    else:
        r["sigma_growth"], r["sigma_where"] = math.nan, ""

    # One-signedness of the delta drift per head.
    drift = {}
    abs_err = []
    r["drift_series"] = {}
    for row in read_csv(os.path.join(run_dir, "delta_drift.csv")):
        drift.setdefault((int(row["layer"]), int(row["head"])), []).append(float(row["delta_drift"]))
        r["drift_series"].setdefault((int(row["layer"]), int(row["head"])), []).append(
            (int(row["step"]), float(row["delta_drift"])))
        abs_err.append(float(row["delta_abs_err"]))
    # The delta error's size (mean over heads and hook steps of sum_rows |d_run - d_fp64|) and
    # its systematic part: the net signed drift over the summed absolute error (-1..1).
    r["abs_err"] = sum(abs_err) / len(abs_err) if abs_err else math.nan
    total_drift = sum(x for d in drift.values() for x in d)
    r["net_drift"] = total_drift / sum(abs_err) if abs_err and sum(abs_err) > 0 else math.nan
    every = [x for d in drift.values() for x in d if x != 0]
    r["pos_frac"] = sum(1 for x in every if x > 0) / len(every) if every else math.nan
    ratios = {}
    for k, d in drift.items():
        total = sum(abs(x) for x in d)
        if total > 0 and len(d) >= 2:
            ratios[k] = (abs(sum(d)) / total, 1 if sum(d) > 0 else -1,
                         sum(1 for x in d if x > 0), len(d))
    if ratios:
        k = max(ratios, key=lambda h: ratios[h][0])
        r["one_signed"], r["one_signed_sign"] = ratios[k][0], ratios[k][1]
        r["one_signed_where"] = f"L{k[0]}H{k[1]}"
        r["sign_p"] = sign_test(ratios[k][2], ratios[k][3])
        r["pos_steps"] = f"{ratios[k][2]}/{ratios[k][3]}"
        r["one_signed_median"] = statistics.median(v[0] for v in ratios.values())
        r["hook_steps"] = max(len(d) for d in drift.values())
    else:
        r.update(one_signed=math.nan, one_signed_sign=0, one_signed_where="",
                 one_signed_median=math.nan, hook_steps=0, sign_p=math.nan, pos_steps="")

    ties = {}
    r["tie_series"] = {}
    for row in read_csv(os.path.join(run_dir, "attn_stats.csv")):
        if row["stat"] == "tied_row_frac":
            ties.setdefault((int(row["layer"]), int(row["head"])), []).append(float(row["value"]))
            r["tie_series"].setdefault(int(row["step"]), []).append(float(row["value"]))
    if ties:
        means = [sum(v) / len(v) for v in ties.values()]
        r["ties_mean"], r["ties_max"] = sum(means) / len(means), max(means)
    else:
        r["ties_mean"] = r["ties_max"] = math.nan
    return r


def fmt(x, spec=".3f"):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def mean_se(xs, spec=".3f", se_spec=None):
    """'mean ± standard error' of the finite values, each formatted by spec (se_spec)."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "-"
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return format(m, spec)
    return f"{format(m, spec)} ± {format(statistics.stdev(xs) / math.sqrt(len(xs)), se_spec or spec)}"


def trailing_mean(series, step, window=WINDOW):
    """Mean of the finite values of [(step, value)] over the `window` steps ending at step."""
    xs = [v for s, v in series if step - window < s <= step and v is not None and math.isfinite(v)]
    return sum(xs) / len(xs) if xs else math.nan


def print_explosions(groups, reference):
    labels = [", ".join(k) if k else "-" for k in groups]
    ref = 0
    if reference:
        hits = [i for i, l in enumerate(labels) if reference == l] or \
               [i for i, l in enumerate(labels) if reference in l]
        if len(hits) != 1:
            sys.exit(f"repro_summary: error: --reference {reference!r} matches {len(hits)} "
                     f"configurations (of: {'; '.join(labels)}); give a substring of one")
        ref = hits[0]
    rs_ref = list(groups.values())[ref]
    k_ref = sum(1 for r in rs_ref if r["explosion"])
    print(f"| configuration | explosion step per seed | exploded | 95% interval | "
          f"Fisher p vs {labels[ref]} | net | permutation p of net | drift > 0 | "
          f"permutation p of drift > 0 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, rs in zip(labels, groups.values()):
        rs = sorted(rs, key=lambda r: int(r["seed"] or 0))
        per_seed = ", ".join(f"{r['seed']}: {r['explosion'] or 'none'}" for r in rs)
        k, n = sum(1 for r in rs if r["explosion"]), len(rs)
        lo, hi = clopper_pearson(k, n)
        p = fisher_exact(k, n - k, k_ref, len(rs_ref) - k_ref)
        is_ref = label == labels[ref]
        cols = []
        for key in ("net_drift", "pos_frac"):
            pp = permutation_p([r[key] for r in rs], [r[key] for r in rs_ref])
            cols += [mean_se([r[key] for r in rs], ".4f" if key == "net_drift" else ".3f"),
                     "-" if is_ref else fmt(pp, ".2g")]
        print(f"| {label} | {per_seed} | {k} of {n} | {lo:.2f}-{hi:.2f} | "
              f"{'-' if is_ref else format(p, '.3g')} | {' | '.join(cols)} |")
    print()
    print("Explosion: apps/repro_summary.py's docstring; 'none' survived to its last step. "
          "Interval: Clopper-Pearson, exact. p: Fisher's exact test, two-sided. net and "
          "drift > 0: the second table's columns, mean ± SE over seeds; their p: exact "
          "two-sided permutation test of the difference in means against the reference.")


def print_timeline(r, every):
    top = r.get("top_wq")
    hook_steps = sorted(r["tie_series"])
    if not hook_steps or top is None:
        print(f"{r['run']}: no hook files (attn_stats.csv, spectral.csv)")
        return
    sig = dict(r["sigma_series"].get(top, []))
    head = (top[1], top[2])
    cum, running = {}, 0.0
    for s, v in sorted(r["drift_series"].get(head, [])):
        running += v
        cum[s] = running
    print(f"**{r['run']}** (seed {r['seed']}; explosion: {r['explosion'] or 'none'}; top head "
          f"W_Q L{top[1]}H{top[2]})")
    print()
    print("| step | loss (20-step mean) | grad norm (20-step mean) | ties (mean over heads) | "
          f"sigma W_Q L{top[1]}H{top[2]} | its delta drift, running sum |")
    print("|---|---|---|---|---|---|")
    for i, s in enumerate(hook_steps):
        if i % every and s != hook_steps[-1]:
            continue
        ties = r["tie_series"][s]
        print(f"| {s} | {fmt(trailing_mean(r['train'], s))} | "
              f"{fmt(trailing_mean(r['grads'], s), '.3g')} | {fmt(sum(ties) / len(ties), '.4f')} | "
              f"{fmt(sig.get(s, math.nan), '.2f')} | {fmt(cum.get(s, math.nan), '.2e')} |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("studies", nargs="+", help="study folders (or run folders)")
    ap.add_argument("--json", help="also write every run's figures to this JSON file")
    ap.add_argument("--explosions", action="store_true",
                    help="also the explosion-step table with intervals and Fisher p-values")
    ap.add_argument("--reference", default="",
                    help="with --explosions: the configuration the p-values compare against "
                         "(its label, or a substring of one label; default: the first)")
    ap.add_argument("--timeline", type=int, default=0, metavar="EVERY",
                    help="also every run's timeline at every EVERY-th hook step")
    args = ap.parse_args()

    runs = []
    for d in args.studies:
        if os.path.exists(os.path.join(d, "config.yaml")):
            runs.append(summarise_run(d))
            continue
        if not os.path.isdir(d):
            sys.exit(f"repro_summary: error: {d}: no such folder (give a study's out_dir)")
        for name in sorted(os.listdir(d)):
            if os.path.exists(os.path.join(d, name, "config.yaml")):
                runs.append(summarise_run(os.path.join(d, name)))
                if len(args.studies) > 1:  # run names repeat across studies
                    runs[-1]["run"] = os.path.basename(os.path.normpath(d)) + "/" + name
    if not runs:
        sys.exit("repro_summary: error: no run folders (with config.yaml) in " + " ".join(args.studies))

    # What varies between the runs (besides the seed) names the configurations.
    # A key missing from some runs' config.yaml is newer than the binary that trained them:
    # those runs had its default. It names configurations only if the runs that have it
    # disagree (a missing value then shows as "-").
    keys = sorted({k for r in runs for k in r["config"]} - IGNORE)
    varying = [k for k in keys if len({r["config"][k] for r in runs if k in r["config"]}) > 1]

    print("| run | seed | steps | explosion | spikes | final loss | val loss | grad norm | sigma growth | "
          "one-signed drift: top head, + steps, p (median) | drift > 0 | ties mean / max |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        steps = f"{r['steps']}" + ("" if r["steps"] >= r["max_steps"] else f" of {r['max_steps']}")
        sign = "+" if r["one_signed_sign"] > 0 else "-" if r["one_signed_sign"] < 0 else ""
        print(f"| {r['run']} | {r['seed']} | {steps} | {r['explosion'] or 'none'} | {r['spikes']} | "
              f"{fmt(r['final_loss'])} | {fmt(r['val_loss'])} | {fmt(r['final_grad_norm'], '.2f')} | "
              f"{fmt(r['sigma_growth'], '.2f')} "
              f"({r['sigma_where']}) | {fmt(r['one_signed'], '.2f')}{sign} {r['one_signed_where']} "
              f"{r['pos_steps']} p={fmt(r['sign_p'], '.1g')} ({fmt(r['one_signed_median'], '.2f')}) | "
              f"{fmt(r['pos_frac'], '.2f')} | {fmt(r['ties_mean'], '.4f')} / "
              f"{fmt(r['ties_max'], '.4f')} |")

    groups = {}
    for r in runs:
        groups.setdefault(tuple(r["config"].get(k, "-") for k in varying), []).append(r)
    print()
    label = ", ".join(varying) if varying else "(one configuration)"
    print(f"| {label} | seeds | exploded | final loss | val loss | grad norm | sigma growth | "
          "one-signed drift | drift > 0 | abs err | net | ties mean |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key, rs in groups.items():
        exploded = [r for r in rs if r["explosion"]]
        at = ", ".join(str(r["explosion"]) for r in exploded)
        print(f"| {', '.join(key) if key else '-'} | {len(rs)} | {len(exploded)} of {len(rs)}"
              f"{' (' + at + ')' if at else ''} | {mean_se([r['final_loss'] for r in rs])} | "
              f"{mean_se([r['val_loss'] for r in rs])} | {mean_se([r['final_grad_norm'] for r in rs], '.2f')} | "
              f"{mean_se([r['sigma_growth'] for r in rs], '.2f')} | {mean_se([r['one_signed'] for r in rs], '.2f')} | "
              f"{mean_se([r['pos_frac'] for r in rs], '.2f')} | {mean_se([r['abs_err'] for r in rs], '.2e', '.1e')} | "
              f"{mean_se([r['net_drift'] for r in rs], '.4f')} | {mean_se([r['ties_mean'] for r in rs], '.4f')} |")
    print()
    print("Means ± standard error over the seeds of a configuration. Columns: "
          "apps/repro_summary.py's docstring and docs/reproduction.md.")
    if args.explosions:
        print()
        print_explosions(groups, args.reference)
    if args.timeline > 0:
        print()
        for r in runs:
            print_timeline(r, args.timeline)
    if args.json:
        def finite(v):  # JSON has no NaN: null
            return None if isinstance(v, float) and not math.isfinite(v) else v
        with open(args.json, "w") as f:
            series = {"train", "grads", "sigma_series", "drift_series", "tie_series", "top_wq"}
            json.dump([{k: finite(v) for k, v in r.items() if k not in series} for r in runs],
                      f, indent=1, allow_nan=False)


if __name__ == "__main__":
    main()
