"""Writes a safetensors file from numpy arrays (F32, F16 and U8), standard library and numpy only:
the format is an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the bytes."""
import json
import os
import struct

import numpy as np

DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint8): "U8"}


def write_safetensors(path, tensors):
    """`tensors`: (name, numpy array) pairs, written in order."""
    header, offset, blobs = {}, 0, []
    for name, arr in tensors:
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": DTYPES[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(path + ".tmp", path)
