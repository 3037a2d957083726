#!/usr/bin/env python3
"""Issue 19's reliability probe, repeatable: runs the interruption, lock, fuzz and MPI-failure
tests of the build and prints one markdown table with the probe's columns (cases, clean error,
crash/hang, silently accepted, data lost), each row from the tests' own output.

    python3 tools/reliability_probe.py [--build build] [--trials 40] [--fuzz-iters 2000]

Rows:
  kill -9            test_run_safety RunSafetySlow.CrashConsistencyMany (random kills while
                     training, checkpointing and resuming) + the chosen-point kills test
  SIGINT/SIGTERM     RunSafetySlow.StopSignalsAtRandomMoments + the two signal tests
  disk full          RunSafetySlow.DiskFullThenResume (RLIMIT_FSIZE 4..1024 KiB) + TrainStopsOnAFullDisk
  run directory      the lock tests (concurrent starts, resumes, --overwrite while running)
  fuzz <target>      test_fuzz with STABLETRAIN_FUZZ_ITERS cases per target
  MPI rank failures  test_distributed DataParallel.FailingRankEndsEveryRank... (4 scenarios)
  SIGTERM to mpirun  test_distributed DataParallel.SigtermToMpirun... (every rank checkpoints
                     the same step; the resumed job equals the uninterrupted one)
  resume mismatch    test_trainer TrainResume.CheckpointOfOtherArithmeticIsRefused (crafted
                     checkpoints: another compute format, non-UTF-8 config, loss scale, step)
  hook state damage  test_trainer TrainBadInput.DamagedHooksStateIsRefusedAtEveryOffset (every
                     8-byte slot of a real hooks_state set to 0xff.. and to 2^40)
  non-finite state   test_trainer NonFiniteWeightsAreNeverCheckpointed + NanLossStops... and
                     test_checkpoint InconsistentValuesAreRefused (loss scales, NaN, inf)
A row's failures show as crash/hang or data lost; "silently accepted" counts inputs the
tests require to be refused that were accepted (a failed refusal assertion).
"""
import argparse
import os
import re
import subprocess
import sys
import time


def run(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    t0 = time.time()
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout, time.time() - t0


def gtest_counts(out):
    passed = len(re.findall(r"^\[       OK \]", out, re.M))
    failed = len(re.findall(r"^\[  FAILED  \] \S+ \(", out, re.M))
    return passed, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--trials", type=int, default=40, help="runs per random-interruption kind")
    ap.add_argument("--fuzz-iters", type=int, default=2000, help="fuzz cases per target")
    a = ap.parse_args()
    b = os.path.join(a.build, "bin")
    rows = []
    log = []

    def safety(flt, env=None):
        rc, out, dt = run([os.path.join(b, "test_run_safety"), "--gtest_filter=" + flt], env)
        log.append((flt, dt, out))
        return rc, out

    trials = {"STABLETRAIN_CRASH_TRIALS": str(a.trials)}
    for kind, slow, fixed, nfixed in [
        ("kill -9", "RunSafetySlow.CrashConsistencyMany",
         "RunSafety.KillAfterCheckpointRenameAndDuringResume", 2),
        ("SIGINT/SIGTERM", "RunSafetySlow.StopSignalsAtRandomMoments",
         "RunSafety.SigtermWritesACheckpointAndResumesExactly:RunSafety.SecondSignalEndsAtOnce", 2),
        ("disk full", "RunSafetySlow.DiskFullThenResume", "RunSafety.TrainStopsOnAFullDisk", 1),
    ]:
        rc, out = safety(slow, trials)
        m = re.search(r"probe: [^:]+: (\d+) runs, (\d+) attempts, (\d+) interrupted, (\d+) with a "
                      r"clean message", out)
        rc2, out2 = safety(fixed)
        p2, f2 = gtest_counts(out2)
        if m:
            runs, att, inter, clean = map(int, m.groups())
        else:
            runs, att, inter, clean = a.trials, 0, 0, 0
        lost = 0 if (m and rc == 0) else max(1, len(re.findall(r"differs from the reference", out)))
        hang = len(re.findall(r"hangs|never finished|did not end", out + out2))
        rows.append((kind, inter + nfixed, (clean + p2) if kind != "kill -9" else "n/a (kill)",
                     hang, 0, lost + f2,
                     f"{runs} runs interrupted {inter} times at random + {nfixed} at chosen points; "
                     f"end state of every run equal to the uninterrupted run's"
                     if lost + f2 == 0 else "FAILURES: see the log"))
    rc, out = safety("RunSafety.SecondProcess*:RunSafety.TwoRuns*:RunSafety.TwoResumes*")
    p, f = gtest_counts(out)
    # Scenarios: --resume and --overwrite and a plain start while a run holds the directory,
    # resume after the holder died, 4 concurrent fresh starts, 3 concurrent resumes.
    rows.append(("run directory", 11, 11 if f == 0 else "?", 0, f, 0,
                 "concurrent starts/resumes, --overwrite or --resume while running: the second "
                 "process refused with the holder's PID" if f == 0 else "FAILURES: see the log"))

    fz = os.path.join(b, "test_fuzz")
    if os.path.exists(fz):
        rc, out, dt = run([fz], {"STABLETRAIN_FUZZ_ITERS": str(a.fuzz_iters)})
        log.append(("test_fuzz", dt, out))
        summarised = set(re.findall(r"^fuzz (\S+): \d+ cases in", out, re.M))
        for name in sorted(set(re.findall(r"^fuzz (\S+): FAILED", out, re.M)) - summarised):
            rows.append((f"fuzz {name}", "?", "?", 1, "n/a", 0,
                         "stopped at its first failure: see the log (its input is saved)"))
        if rc != 0 and not re.search(r"^fuzz \S+: FAILED", out, re.M):
            rows.append(("fuzz", "?", "?", 1, "n/a", 0, f"test_fuzz exited {rc}: see the log"))
        for m in re.finditer(r"^fuzz (\S+): (\d+) cases in [\d.]+ s, (\d+) failed", out, re.M):
            name, cases, failed = m.group(1), int(m.group(2)), int(m.group(3))
            acc = re.search(r"^fuzz %s: .*?(\d+) refused with st::Error, (\d+) accepted"
                            % re.escape(name), out, re.M)
            clean = int(acc.group(1)) if acc else "?"
            rows.append((f"fuzz {name}", cases, clean, failed, "n/a", 0,
                         f"{acc.group(2)} mutated inputs loaded without error (a mutation "
                         "that leaves a valid file, e.g. a changed value, is accepted)"
                         if acc else "a subprocess (compare): its refusals (exit 1) and "
                         "acceptances are not told apart; none crashed or hung"))
    else:
        rows.append(("fuzz", 0, 0, 0, 0, 0, f"{fz} not built"))

    rc, out, dt = run([os.path.join(b, "test_distributed"),
                       "--gtest_filter=DataParallel.FailingRankEndsEveryRank*"])
    log.append(("mpi", dt, out))
    p, f = gtest_counts(out)
    rows.append(("MPI rank failures", 4, 4 if f == 0 else "?", f, 0, 0,
                 "a rank exits, hangs, throws, or dies while checkpointing: every rank ends with "
                 "one error, no half checkpoint" if f == 0 else "FAILURES: see the log"))

    rc, out, dt = run([os.path.join(b, "test_distributed"),
                       "--gtest_filter=DataParallel.SigtermToMpirun*"])
    log.append(("mpi sigterm", dt, out))
    p, f = gtest_counts(out)
    rows.append(("SIGTERM to mpirun", 1, 1 if f == 0 and p == 1 else "?", 0, 0, f,
                 "2 ranks, ZeRO-1: both shards and the main file of the stop step; resumed job "
                 "equal to the uninterrupted one" if f == 0 and p == 1 else
                 "FAILURES (or not run: no MPI?): see the log"))

    def trainer(flt):
        rc, out, dt = run([os.path.join(b, "test_trainer"), "--gtest_filter=" + flt])
        log.append((flt, dt, out))
        return out

    # Crafted checkpoints of other arithmetic: one printed line per case, "what -> error".
    out = trainer("TrainResume.CheckpointOfOtherArithmeticIsRefused")
    p, f = gtest_counts(out)
    cases = re.findall(r"^  (.+?)\s+-> train: error: ", out, re.M)
    rows.append(("resume mismatch", len(cases), len(cases) if f == 0 else "?", 0, f, 0,
                 "crafted checkpoints (" + ", ".join(c.strip() for c in cases) + ") each refused "
                 "in one line, checkpoint and logs unchanged; an allowed change logged in "
                 "train.log and metrics.jsonl" if f == 0 and cases else "FAILURES: see the log"))
    out = trainer("TrainBadInput.DamagedHooksStateIsRefusedAtEveryOffset")
    p, f = gtest_counts(out)
    m = re.search(r"hooks_state of (\d+) bytes: (\d+) damaged copies refused, (\d+) holding "
                  r"valid values kept exactly", out)
    if m:
        size, refused, kept = map(int, m.groups())
        rows.append(("hook state damage", refused + kept + 3, refused + 3 if f == 0 else "?", 0,
                     f, 0, f"every 8-byte slot of a {size}-byte state set to 0xff.. and to 2^40: "
                     f"{refused} refused naming field and offset, {kept} holding values a valid "
                     "state may hold kept exactly; 3 more through train" if f == 0 else
                     "FAILURES: see the log"))
    else:
        rows.append(("hook state damage", "?", "?", 0, "?", 0, "no summary line: see the log"))
    out = trainer("TrainBadInput.NonFiniteWeightsAreNeverCheckpointed:"
                  "TrainBadInput.NanLossStopsAndKeepsLastGoodCheckpoint")
    p, f = gtest_counts(out)
    rc, out2, dt = run([os.path.join(b, "test_checkpoint"),
                        "--gtest_filter=Checkpoint.InconsistentValuesAreRefused"])
    log.append(("test_checkpoint", dt, out2))
    p2, f2 = gtest_counts(out2)
    rows.append(("non-finite state", 2 + 1, 3 if f + f2 == 0 else "?", 0, f + f2, 0,
                 "NaN weight never checkpointed, NaN loss stops naming the last good checkpoint, "
                 "NaN/inf/out-of-range loss scales refused at load" if f + f2 == 0 else
                 "FAILURES: see the log"))

    print("| area | cases | clean error | crash/hang | silently accepted | data lost | notes |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print()
    for name, dt, _ in log:
        print(f"- `{name}`: {dt:.0f} s")
    bad = any(any(isinstance(x, int) and x for x in r[3:6]) for r in rows)
    if bad:
        for name, dt, out in log:
            sys.stderr.write(f"==== {name}\n{out[-4000:]}\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
