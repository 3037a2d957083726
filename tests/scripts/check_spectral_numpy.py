#!/usr/bin/env python3
"""Independent check of spectral.csv: numpy's SVD of the same weight slices, read from a
checkpoint by a reader written from the file format (io/checkpoint.cpp) and the slice
layout (analysis/slices.h), not through stabletrain's C++.

usage: check_spectral_numpy.py RUN_DIR STEP [REL_TOL]
Prints the number of rows checked and the largest relative difference; exits 1 if any
sigma differs from numpy's largest singular value by more than REL_TOL (default 1e-4)."""
import csv
import sys

import numpy as np

from st_checkpoint import master_weights, slice_matrices


def main():
    run, step = sys.argv[1], int(sys.argv[2])
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    shape, ckpt_step, flat = master_weights(f"{run}/ckpt_{step:08d}.bin")
    assert ckpt_step == step
    mats = slice_matrices(shape, flat)
    checked, worst, bad = 0, 0.0, []
    with open(f"{run}/spectral.csv") as f:
        for row in csv.DictReader(f):
            if int(row["step"]) != step:
                continue
            # -1 (or empty, in files written before 2026-11-27): not per layer / head
            key = (row["matrix"], int(row["layer"]) if row["layer"] else -1,
                   int(row["head"]) if row["head"] else -1)
            ref = np.linalg.svd(mats[key], compute_uv=False)[0]
            rel = abs(float(row["sigma"]) - ref) / ref
            worst = max(worst, rel)
            checked += 1
            if rel > tol:
                bad.append(f"{key}: {row['sigma']} vs numpy {ref!r} (rel {rel:.2e})")
    print(f"checked {checked} slices at step {step}: max relative difference {worst:.3e}")
    for b in bad:
        print("MISMATCH", b)
    sys.exit(1 if bad or checked == 0 else 0)


if __name__ == "__main__":
    main()
