#!/usr/bin/env python3
"""The cost model's predictions beside a GPU's measured kernel times.

Reads the predictions that build/bin/simt_cost_model wrote (--csv; committed as
bench/results/*_cost_model_h200.csv) and the table that `bench_gpu kernels` printed on a GPU,
and prints, per kernel row of both, the measured time, the predicted time and their ratio,
with the largest |error| at the end. Rows only one side has are listed as such. Run by
tools/gpu_check.sh's bench stage:

    python3 tools/cost_model_vs_measured.py PREDICTIONS.csv BENCH_GPU_OUTPUT.txt
"""
import csv
import re
import sys


def measured_rows(path):
    """{kernel: microseconds} from bench_gpu kernels' markdown table."""
    rows = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 6 or not re.fullmatch(r"[0-9.]+", cells[2]):
                continue
            rows[cells[0]] = float(cells[2])
    return rows


def predicted_rows(path):
    """{row: predicted microseconds}. A row the fit left out because its kernel changed after
    the calibration's measurement is kept (its prediction is of the kernel as it is now,
    which is what a new measurement tests); a row with no prediction (a replaced host path,
    predicted 0) is not."""
    rows = {}
    with open(path, encoding="utf-8") as f:
        for r in csv.DictReader(f):
            us = float(r["predicted_us"])
            if us > 0:
                rows[r["row"]] = us
    return rows


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    pred = predicted_rows(argv[1])
    meas = measured_rows(argv[2])
    if not meas:
        print(f"cost_model_vs_measured: no bench_gpu kernels table in {argv[2]}", file=sys.stderr)
        return 1
    print(f"cost model ({argv[1]}) vs this GPU ({argv[2]})\n")
    print("| kernel (bf16) | measured us | predicted us | predicted / measured |")
    print("|---|---|---|---|")
    worst = 0.0
    for name, us in meas.items():
        if name in pred:
            ratio = pred[name] / us
            worst = max(worst, abs(ratio - 1))
            print(f"| {name} | {us:.1f} | {pred[name]:.1f} | {ratio:.2f} |")
    only_meas = [n for n in meas if n not in pred]
    only_pred = [n for n in pred if n not in meas]
    print(f"\n{sum(n in pred for n in meas)} rows on both sides; largest |predicted/measured - 1| "
          f"= {100 * worst:.1f}% (the model's acceptance: 20%)")
    if only_meas:
        print("measured only (the model has no row):", ", ".join(only_meas))
    if only_pred:
        print("predicted only (not measured here):", ", ".join(only_pred))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
