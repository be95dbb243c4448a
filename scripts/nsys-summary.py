#!/usr/bin/env python3
"""Where a served sweep's GPU time went, from `nsys stats --report cuda_gpu_kern_sum --format csv`
(scripts/gpu-check.sh, SLUICE_GPU_NSYS_LEVEL=N): every kernel launched while N clients decoded,
those of replayed graphs included, summed by kind (GEMMs, attention, norms...) and the heaviest
kernels by name."""
import csv
import re
import sys

KINDS = [
    ("GEMM (cuBLAS/cuBLASLt)", r"gemm|nvjet|cutlass|xmma|splitKreduce|cublas|Kernel2|ampere|sm90"),
    ("attention", r"paged_attention|attention_combine"),
    ("add + RMSNorm", r"rms_norm"),
    ("SwiGLU", r"swiglu"),
    ("RoPE", r"rope"),
    ("K/V write", r"write_kv"),
    ("bias", r"add_bias"),
    ("sampling", r"sample_rows"),
    ("embedding", r"gather_rows|index_select|emb"),
    ("casts and copies (candle)", r"cast|copy|ucopy|affine|fill"),
]

lines = [l for l in open(sys.argv[1]) if l.count(",") >= 3]
rows = list(csv.reader(lines))
head = next((i for i, r in enumerate(rows) if "Name" in r and any("Total Time" in c for c in r)), None)
if head is None:
    print("(no kernel summary)")
    sys.exit()
cols = rows[head]
name = cols.index("Name")
total_col = next(i for i, c in enumerate(cols) if c.startswith("Total Time"))
count_col = cols.index("Instances")
kernels = []
for r in rows[head + 1:]:
    try:
        kernels.append((r[name], float(r[total_col]), int(r[count_col])))
    except (ValueError, IndexError):
        pass
busy = sum(t for _, t, _ in kernels)
if busy == 0:
    print("(no kernels recorded)")
    sys.exit()
print(f"{sum(c for *_, c in kernels)} kernels, {busy / 1e6:.1f} ms of GPU time in all")
sums = {}
for n, t, c in kernels:
    kind = next((k for k, pat in KINDS if re.search(pat, n, re.I)), "other")
    sums[kind] = sums.get(kind, 0.0) + t
for kind, t in sorted(sums.items(), key=lambda kv: -kv[1]):
    print(f"{100 * t / busy:5.1f}%  {t / 1e6:9.1f} ms  {kind}")
print("heaviest kernels:")
for n, t, c in sorted(kernels, key=lambda k: -k[1])[:15]:
    print(f"{100 * t / busy:5.1f}%  {c:7d} x {t / c / 1e3:8.1f} us  {n[:90]}")
