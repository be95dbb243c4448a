#!/usr/bin/env python3
"""Fails if any module of a workspace crate imports a module that imports it back, file by
file and folder by folder.

An edge A -> B is any `crate::b...` or `super::...` path in A's source (in `use` lines and
in code, test modules included), with B the module that path names; a module's children
(declared with `mod`) are not edges of their own. Then the same at every folder level: a
module with submodules is one room to a reader, so at depth d every module is taken as its
ancestor of d path segments (`openai::chat` is `openai` at depth 1), and two such rooms that
import each other, directly or around a longer circle, fail too. Prints each cycle found and
exits 1. Usage: scripts/check-module-cycles.py [crates/*]
"""
import glob
import os
import re
import sys


def module_of(src_root, path):
    rel = os.path.relpath(path, src_root)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def resolve(known, mod, path):
    """The longest known module prefix of a `crate::`/`super::` path seen in `mod`."""
    segs = path.split("::")
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    else:
        base = mod
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
        if segs and segs[0] == "self":
            segs = segs[1:]
    target = base
    for s in segs:
        if base + (s,) in known:
            base = base + (s,)
            target = base
        else:
            break
    return target


def crate_cycles(crate_dir):
    src = os.path.join(crate_dir, "src")
    files = glob.glob(os.path.join(src, "**", "*.rs"), recursive=True)
    mods = {module_of(src, f): f for f in files}
    known = set(mods)
    edges = {m: set() for m in mods}
    path_re = re.compile(r"\b(crate|super)((?:::\w+)+)")
    group_re = re.compile(r"\b(crate|super)((?:::\w+)*)::\{([^}]*)\}")
    for mod, f in mods.items():
        text = open(f, encoding="utf-8").read()
        text = re.sub(r"//[^\n]*", "", text)
        found = []
        for m in group_re.finditer(text):
            for item in m.group(3).split(","):
                item = item.strip().split(" as ")[0].strip()
                if item and item != "self":
                    found.append(m.group(1) + m.group(2) + "::" + item.replace("{", ""))
                elif item == "self":
                    found.append(m.group(1) + m.group(2))
        for m in path_re.finditer(text):
            found.append(m.group(1) + m.group(2))
        for p in found:
            t = resolve(known, mod, p)
            # A module's own descendants and ancestors (the crate root re-exports) are not edges.
            if t == mod or t[: len(mod)] == mod or mod[: len(t)] == t:
                continue
            edges[mod].add(t)
    found = [("file", comp) for comp in strongly_connected(edges)]
    depth = max((len(m) for m in edges), default=0)
    for d in range(1, depth):
        folders = {}
        for a, targets in edges.items():
            ra = a[:d]
            folders.setdefault(ra, set())
            for b in targets:
                rb = b[:d]
                # A room's own parts, and the rooms it sits in, are not edges between rooms.
                if ra == rb or ra[: len(rb)] == rb or rb[: len(ra)] == ra:
                    continue
                folders[ra].add(rb)
        for comp in strongly_connected(folders):
            if all(len(m) == d for m in comp) and any(
                len(m) < len(full) and full[:d] == m for m in comp for full in edges
            ):
                found.append((f"folder (depth {d})", comp))
    return found


def strongly_connected(edges):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in edges:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            strong(v)
    return sccs


def main():
    crates = sys.argv[1:] or sorted(glob.glob("crates/*"))
    bad = False
    for c in crates:
        for level, comp in crate_cycles(c):
            bad = True
            names = ["::".join(m) or "(root)" for m in sorted(comp)]
            print(f"{os.path.basename(c)}: {level} import cycle among {', '.join(names)}")
    if bad:
        sys.exit(1)
    print(f"no module import cycles in {len(crates)} crates")


main()
