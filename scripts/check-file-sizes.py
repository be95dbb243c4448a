#!/usr/bin/env python3
"""Fails if a Rust source file of the workspace is longer than 1,200 lines: a file that long
holds more than one job (ARCHITECTURE.md: one module, one job). Tests count too; a long test
module goes to a file of its own (`mod tests;` beside the code, `NAME/tests.rs`). Prints each
file over the limit and exits 1. Usage: scripts/check-file-sizes.py [crates/*]
"""
import glob
import os
import sys

LIMIT = 1200


def main(roots):
    over = []
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "**", "*.rs"), recursive=True)):
            if f"{os.sep}target{os.sep}" in path:
                continue
            with open(path, encoding="utf-8") as f:
                lines = sum(1 for _ in f)
            if lines > LIMIT:
                over.append((lines, path))
    for lines, path in over:
        print(f"{path}: {lines} lines, over the {LIMIT}-line limit")
    if over:
        return 1
    print(f"every Rust file is at most {LIMIT} lines")
    return 0


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    default = sorted(glob.glob(os.path.join(here, "..", "crates", "*")))
    sys.exit(main(sys.argv[1:] or default))
