#!/usr/bin/env python3
"""Tiny Shakespeare training speed on a shared machine (issue 22): tokens/s of the default
config (configs/tiny_shakespeare.yaml: GPT-2 L4 C128, B8 T64, FP32, CPU) with run.threads
1, 2 and auto, under the OpenMP wait policies passive (stabletrain's default) and libgomp's
default spin-then-sleep (GOMP_SPINCOUNT=300000) and a short spin (10000), on a quiet machine and with N competing
CPU-bound processes (a Python busy loop each).

Each cell is one run of STEPS steps (no evaluation, checkpoint, sample or hooks) cut at
TIMEOUT seconds; steps 2..last count. It prints mean s/step +- SE over those steps, tokens/s
(tokens / summed step time) and tokens/s as a fraction of the same threads/policy when
quiet. The load average before each cell is printed: other tenants of the machine count as
competitors too.

usage: bench/plans/threads_contention.py [--bin build/bin/train] [--steps 40]
       [--competitors 0,1] [--timeout 120] > bench/results/DATE_cpu_threads_2core.md
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

# passive: stabletrain's default; spin: libgomp's own default (spin 300k iterations, then
# sleep); spin10k: a short spin. Each is set explicitly: until 2026-11-28 "passive" was the
# executable's own default, which did not reach libgomp (it ran spin 300k; see
# docs/ARCHITECTURE.md), so the passive and spin rows of bench/results/2026-11-27_cpu_threads*
# ran the same policy.
POLICIES = {"passive": {"OMP_WAIT_POLICY": "passive"}, "spin": {"GOMP_SPINCOUNT": "300000"},
            "spin10k": {"GOMP_SPINCOUNT": "10000"}}


def run_cell(args, threads, policy, out_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                                                            "OMP_NUM_THREADS",
                                                            "STABLETRAIN_RUNTIME_ENV")}
    env.update(POLICIES[policy])
    cmd = [args.bin, "--config", "configs/tiny_shakespeare.yaml", "--overwrite",
           "--set", f"run.out_dir={out_dir}", "--set", f"run.threads={threads}",
           "--set", f"train.max_steps={args.steps}", "--set", "train.eval_every=100000",
           "--set", "train.ckpt_every=100000", "--set", "train.sample_tokens=0",
           "--set", "train.log_every=1"]
    try:
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=args.timeout)
    except subprocess.TimeoutExpired:
        pass  # the steps logged so far count
    dts, tokens = [], 0
    path = os.path.join(out_dir, "metrics.jsonl")
    if os.path.exists(path):
        for line in open(path):
            j = json.loads(line)
            if "loss" in j and j["step"] >= 2:
                n = 512  # B 8 x T 64
                dts.append(n / j["tokens_per_s"])
                tokens += n
    log = open(os.path.join(out_dir, "train.log")).read() if os.path.exists(
        os.path.join(out_dir, "train.log")) else ""
    choice = [l.split("run.threads auto: ")[1].split(" (")[0] for l in log.splitlines()
              if "run.threads auto:" in l]
    return dts, tokens, choice


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin/train")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--competitors", default="0,1")
    ap.add_argument("--threads", default="1,2,auto")
    ap.add_argument("--policies", default="passive,spin")
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# run.threads and the OpenMP wait policy on a shared machine\n")
    print(f"- date: {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; commit {commit}; "
          f"{os.cpu_count()} cores")
    print(f"- command: `{' '.join(sys.argv)}`")
    print(f"- each cell: configs/tiny_shakespeare.yaml, {args.steps} steps (no eval/ckpt/sample), "
          f"steps 2..{args.steps} counted, cut at {args.timeout:.0f} s; mean s/step ± SE over "
          "steps; tok/s = tokens / summed step time\n")
    print("| competitors | policy | run.threads | load before | steps | s/step (mean ± SE) | "
          "tok/s | vs quiet | auto chose |")
    print("|---|---|---|---|---|---|---|---|---|")
    quiet = {}
    tmp = tempfile.mkdtemp(prefix="st_threads_")
    try:
        for comp in [int(c) for c in args.competitors.split(",")]:
            procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                     for _ in range(comp)]
            time.sleep(1)
            try:
                for policy in args.policies.split(","):
                    for threads in args.threads.split(","):
                        load = os.getloadavg()[0]
                        dts, tokens, choice = run_cell(args, threads, policy,
                                                       os.path.join(tmp, "run"))
                        n = len(dts)
                        mean = sum(dts) / n if n else float("nan")
                        se = (math.sqrt(sum((d - mean) ** 2 for d in dts) / (n - 1) / n)
                              if n > 1 else float("nan"))
                        tps = tokens / sum(dts) if n else float("nan")
                        if comp == 0:
                            quiet[(policy, threads)] = tps
                        q = quiet.get((policy, threads))
                        rel = f"{tps / q:.2f}" if q else "-"
                        print(f"| {comp} | {policy} | {threads} | {load:.2f} | {n} | "
                              f"{mean:.3f} ± {se:.3f} | {tps:.0f} | {rel} | "
                              f"{'; '.join(choice) if choice else '-'} |", flush=True)
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
