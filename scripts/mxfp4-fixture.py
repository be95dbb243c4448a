#!/usr/bin/env python3
"""Writes crates/sluice-kernels/tests/fixtures/mxfp4.txt: MXFP4 blocks (GGML type 39) and the
f32 values the `gguf` package's reference (`gguf.quants`, the Python port of llama.cpp's
`quantize_row_mxfp4_ref` / `dequantize_row_mxfp4`) gives them, so that the kernels crate checks
its own dequantizer (`QuantFormat::dequantize`) without Python.

Blocks: values quantized by gguf's MXFP4 quantizer at several magnitudes (subnormal scales
included), then raw random bytes with the scale byte at its edges (0, 1, 2 are subnormal
halves, 255 is read as 2^127, so +-12 codes overflow to infinity, as in llama.cpp).

One block a line: the 17 block bytes in hex, then the 32 weights as the hex bits of their
f32. Deterministic (a fixed seed); stdlib + gguf + numpy:

    python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf numpy
    /tmp/gguf-venv/bin/python scripts/mxfp4-fixture.py
"""

import os
import random
import struct

import numpy as np
from gguf import GGMLQuantizationType, quants
from importlib.metadata import version

OUT = os.path.join(
    os.path.dirname(__file__), "..", "crates", "sluice-kernels", "tests", "fixtures", "mxfp4.txt"
)
QT = GGMLQuantizationType.MXFP4


def main() -> None:
    rng = random.Random(39)
    blocks = []
    # Quantized by the reference: normal values at several scales, a zero block, a block of
    # one repeated value, exact table values, and magnitudes whose scale is subnormal.
    for scale in [1.0, 1e-3, 0.05, 37.0, 2.0**-124.5, 2.0**-123.5, 2.0**-120]:
        for _ in range(3):
            values = [rng.gauss(0.0, 1.0) * scale for _ in range(32)]
            blocks.append(quants.quantize(np.array([values], dtype=np.float32), QT))
    blocks.append(quants.quantize(np.zeros((1, 32), dtype=np.float32), QT))
    blocks.append(quants.quantize(np.full((1, 32), -0.3, dtype=np.float32), QT))
    table = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    exact = [s * v for v in table for s in (1, -1)] * 2
    blocks.append(quants.quantize(np.array([exact], dtype=np.float32), QT))
    # Raw bytes: every code, scale bytes at the edges of E8M0 and random ones.
    for e in [0, 1, 2, 3, 100, 126, 127, 128, 129, 200, 253, 254, 255] + [
        rng.randrange(256) for _ in range(8)
    ]:
        qs = bytes(rng.randrange(256) for _ in range(16))
        blocks.append(np.frombuffer(bytes([e]) + qs, dtype=np.uint8).reshape(1, 17))
    lines = [
        f"# MXFP4 blocks and gguf {version('gguf')}'s dequantized f32 (scripts/mxfp4-fixture.py)",
        "# 17 block bytes (hex), then 32 f32 bit patterns (hex)",
    ]
    for blk in blocks:
        blk = np.ascontiguousarray(blk, dtype=np.uint8).reshape(1, 17)
        with np.errstate(over="ignore"):
            values = quants.dequantize(blk, QT).reshape(32).astype(np.float32)
        bits = [struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in values]
        lines.append(blk.tobytes().hex() + " " + " ".join(f"{b:08x}" for b in bits))
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(blocks)} blocks -> {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
