#!/usr/bin/env python3
"""Independent check of `compare`'s weight distances (tests/test_compare_tool.cpp).

    check_w1_scipy.py COMPARE_CSV RUN_A_DIR RUN_B_DIR

Reads, with its own reader written from the file format documented at the top of
io/checkpoint.cpp (not stabletrain's C++), the master weights of RUN_A_DIR/ckpt_<step_a>.bin
and RUN_B_DIR/ckpt_<step_b>.bin for every checkpoint pair (step_a, step_b) of the rows of
COMPARE_CSV whose run_a / run_b are the two directories' names (pairing exact or nearest);
cuts every weight slice out of the flat parameter array by the layout of model/gpt2.h and
analysis/slices.h (wq/wk/wv: rows [h*hs, (h+1)*hs) of the q/k/v third of qkvw[l]; wo:
columns [h*hs, (h+1)*hs) of attprojw[l]; wte without its padding rows); and recomputes per
slice
    w1             scipy.stats.wasserstein_distance on the FP64 values
    w1_normalized  w1 / mean |A|
    max_abs_diff   max |A - B| in FP64
The CSV must hold exactly the slices enumerated here, once per checkpoint pair, with
integer layer / head columns (-1: not per layer / head).

Tolerances: max_abs_diff must be equal exactly (both sides take the difference of the same
two float32 values in FP64, which is a single correctly rounded operation). w1 and
w1_normalized must agree to 1e-9 relative: our W1 is exact in FP64 on the FP32 data up to
the rounding of a compensated sum, while scipy integrates |U - V| over the merged sorted
values with CDFs i/n rounded to FP64 and an uncompensated sum, about 1e-13 relative for
these sizes; 1e-9 leaves a wide margin for that yet catches any real error (a wrong slice, a
wrong sort, a wrong normalisation changes results at the 1e-3 level or more).

Prints "checked N rows ..." and exits 0 when every row matches, 1 otherwise.
"""
import csv
import os
import sys

import numpy as np
from scipy.stats import wasserstein_distance

REL_TOL = 1e-9

from st_checkpoint import master_weights, slices  # noqa: E402

# ---------------------------------------------------------------- check

def close(ours, ref):
    return abs(ours - ref) <= REL_TOL * max(abs(ours), abs(ref))


def main():
    if len(sys.argv) != 4:
        print("usage: check_w1_scipy.py COMPARE_CSV RUN_A_DIR RUN_B_DIR", file=sys.stderr)
        return 2
    csv_path, dir_a, dir_b = sys.argv[1:]
    name_a = os.path.basename(os.path.normpath(dir_a))
    name_b = os.path.basename(os.path.normpath(dir_b))
    by_step = {}
    with open(csv_path, newline="") as f:
        rd = csv.DictReader(f)
        want = ["run_a", "run_b", "step", "step_a", "step_b", "pairing", "tensor", "layer",
                "head", "w1", "w1_normalized", "max_abs_diff"]
        if rd.fieldnames != want:
            print(f"FAIL: header {rd.fieldnames}, expected {want}")
            return 1
        for row in rd:
            if row["run_a"] == name_a and row["run_b"] == name_b:
                sa, sb = int(row["step_a"]), int(row["step_b"])
                pairing = "exact" if sa == sb else "nearest"
                if int(row["step"]) != sa or row["pairing"] != pairing:
                    print(f"FAIL: step {row['step']}, pairing {row['pairing']} in a row of "
                          f"step_a {sa}, step_b {sb}")
                    return 1
                by_step.setdefault((sa, sb), []).append(row)
    if not by_step:
        print(f"FAIL: no rows for run_a={name_a} run_b={name_b} in {csv_path}")
        return 1
    checked, bad, worst = 0, 0, 0.0
    for step, rows in sorted(by_step.items()):
        fa = os.path.join(dir_a, f"ckpt_{step[0]:08d}.bin")
        fb = os.path.join(dir_b, f"ckpt_{step[1]:08d}.bin")
        shape_a, step_a, wa = master_weights(fa)
        shape_b, step_b, wb = master_weights(fb)
        if shape_a != shape_b or (step_a, step_b) != step:
            print(f"FAIL: steps {step}: shapes {shape_a} / {shape_b}, steps {step_a} / {step_b}")
            return 1
        sa, sb = slices(shape_a, wa), slices(shape_b, wb)
        keys = [(r["tensor"], int(r["layer"]), int(r["head"])) for r in rows]
        if sorted(keys) != sorted(sa.keys()) or len(set(keys)) != len(keys):
            print(f"FAIL: step {step}: the CSV's slices {sorted(set(keys) ^ set(sa.keys()))[:8]} "
                  f"differ from the layout's ({len(keys)} rows, {len(sa)} slices)")
            return 1
        for key, r in zip(keys, rows):
            a, b = sa[key], sb[key]
            w1 = wasserstein_distance(a, b)
            mean_abs = np.mean(np.abs(a))
            w1n = w1 / mean_abs if mean_abs > 0 else 0.0
            mad = float(np.max(np.abs(a - b)))
            got = (float(r["w1"]), float(r["w1_normalized"]), float(r["max_abs_diff"]))
            ok = close(got[0], w1) and close(got[1], w1n) and got[2] == mad
            if w1 > 0:
                worst = max(worst, abs(got[0] - w1) / w1)
            if not ok:
                bad += 1
                if bad <= 10:
                    print(f"MISMATCH step {step} {key}: compare w1 {got[0]!r} w1n {got[1]!r} "
                          f"max {got[2]!r}; scipy w1 {w1!r} w1n {w1n!r} max {mad!r}")
            checked += 1
    print(f"checked {checked} rows at {len(by_step)} checkpoint pairs of {name_a} vs {name_b}; "
          f"{bad} mismatches; largest w1 relative difference {worst:.3g} (tolerance {REL_TOL:g})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
