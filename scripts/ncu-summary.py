#!/usr/bin/env python3
"""Kernels of an `ncu --csv --page raw --metrics gpu__time_duration.sum` run, by name: how many
launches, their mean GPU time, and the total (scripts/gpu-check.sh, SLUICE_GPU_NCU=1)."""
import collections
import csv
import sys

rows = list(csv.reader(line for line in open(sys.argv[1]) if line.startswith('"')))
if len(rows) < 3:
    print("(no kernels recorded)")
    sys.exit()
head = rows[0]
name, dur = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
unit = rows[1][dur]
times = collections.defaultdict(list)
for r in rows[2:]:
    try:
        times[r[name][:70]].append(float(r[dur].replace(",", "")))
    except (ValueError, IndexError):
        pass
total = sum(len(v) for v in times.values())
busy = sum(sum(v) for v in times.values())
print(f"{total} kernels, {busy:.1f} {unit} of GPU time in all")
for k, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
    print(f"{len(v):5d} x {sum(v) / len(v):9.2f} {unit}  {k}")
