#!/usr/bin/env python3
"""Structure check for trmask's src/: at most six .rs files at the root, the file-level import
graph has no cycle (a folder's `pub use` re-exports followed to the defining file), no source file
is over 600 lines before its test module, `wgpu::` appears in at most five files (the
device layer: adapter, context, pipeline, buffers; and logits.rs' device-buffer variant), and `anyhow`
is not a library dependency. Prints the graph's layers and exits 1 on any violation."""
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
MAX_LINES = 600
MAX_WGPU_FILES = 5
# src/ root holds the crate root and the few foundations every layer uses; the rest lives in
# folders by domain (input, sampling, engine, correction, metrics, partial, bounds, analysis, …)
MAX_ROOT_FILES = 6


def module_path(f):
    rel = f.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    if parts and parts[0] == "bin":
        return None
    return tuple(parts)


def reexports(mods):
    """For each directory module (mod.rs), the names it re-exports from its children: `pub use
    child::{A, b as C}` maps A and C to the child, `pub use child::*` makes the child the
    fallback. A path through a folder's re-export then points at the file that defines it, so
    a folder declaring its children is not a dependency of everything that names the folder."""
    out = {}
    for mp, f in mods.items():
        if f.name != "mod.rs":
            continue
        names, glob = {}, []
        text = re.sub(r"//[^\n]*", "", f.read_text())
        for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+(\w+)::([^;]+);", text):
            child = tuple(mp) + (m.group(1),)
            if child not in mods:
                continue
            body = m.group(2).strip()
            if body == "*":
                glob.append(child)
                continue
            body = body.strip("{}")
            for item in body.split(","):
                item = item.strip()
                if not item:
                    continue
                name = item.split(" as ")[-1].strip().split("::")[-1]
                first = item.split(" as ")[0].strip().split("::")
                target = child + (first[0],) if child + (first[0],) in mods else child
                names[name] = target
        out[mp] = (names, glob)
    return out


REEXPORTS = {}


def resolve(mods, base, segs):
    """Longest prefix of base+segs that names a module file, following a folder's
    re-exports to the child file that defines the name."""
    full = tuple(base) + tuple(segs)
    for n in range(len(full), 0, -1):
        if full[:n] in mods:
            hit = full[:n]
            if n < len(full) and hit in REEXPORTS:
                names, glob = REEXPORTS[hit]
                if full[n] in names:
                    return names[full[n]]
                if len(glob) == 1:
                    return glob[0]
            return hit
    return None


def refs(text):
    """Yield module paths (as tuples of segments, rooted at crate or relative via super/self)."""
    text = re.sub(r"//[^\n]*", "", text)
    # a visibility (`pub(in crate::gpu)`) names a scope, not a dependency
    text = re.sub(r"pub\(in [^)]*\)", "pub", text)
    # expand `use crate::{a, b::{c}}` groups shallowly by scanning every path token
    for m in re.finditer(r"\b((?:crate|super|self)(?:::(?:super|\w+))+|(?:crate|super|self)(?=::\{))(::\{([^;]*?)\})?", text):
        head = m.group(1).split("::")
        group = m.group(3)
        if group:
            for item in re.findall(r"\b(\w+(?:::\w+)*)", group):
                yield head + item.split("::")
        else:
            yield head


def main():
    files = sorted(p for p in SRC.rglob("*.rs"))
    mods = {}
    for f in files:
        mp = module_path(f)
        if mp is not None:
            mods[mp] = f
    REEXPORTS.update(reexports(mods))
    edges = {mp: set() for mp in mods}
    for mp, f in mods.items():
        is_mod_file = f.name in ("mod.rs", "lib.rs")
        here = list(mp) if is_mod_file else list(mp[:-1])  # directory module for `super`
        text = f.read_text()
        # the test module's `super` is this file, not its parent: read up to `#[cfg(test)]`
        cut = text.find("\n#[cfg(test)]")
        for path in refs(text if cut < 0 else text[:cut]):
            if path[0] == "crate":
                base, segs = [], path[1:]
            else:
                base = list(mp) if is_mod_file else list(mp)
                segs = list(path)
                cur = list(mp)
                # `self` is this module; each `super` goes one module up
                while segs and segs[0] in ("self", "super"):
                    if segs[0] == "super":
                        cur = cur[:-1]
                    segs = segs[1:]
                base = cur
            tgt = resolve(mods, base, segs)
            if tgt is None or tgt == mp:
                continue
            # lib.rs declares every module: its edges say nothing about layering
            if mp == ():
                continue
            edges[mp].add(tgt)
    # a directory module (mod.rs) uses the children it declares
    for mp in mods:
        if mp != () and mods[mp].name == "mod.rs":
            edges[mp].update(c for c in mods if len(c) == len(mp) + 1 and c[: len(mp)] == mp)
    # strongly connected components (Tarjan)
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
            sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in mods:
        if v not in index:
            strong(v)
    name = lambda mp: "/".join(mp) or "lib"
    cycles = [c for c in sccs if len(c) > 1]
    ok = True
    print(f"import graph: {len(mods)} source files, {sum(len(e) for e in edges.values())} file-level edges")
    if cycles:
        ok = False
        for c in cycles:
            print("  CYCLE:", " <-> ".join(sorted(name(m) for m in c)))
    else:
        # layers: longest path to a leaf
        depth = {}

        def d(v):
            if v not in depth:
                depth[v] = 0
                depth[v] = 1 + max((d(w) for w in edges[v]), default=-1)
            return depth[v]

        for v in mods:
            d(v)
        print("  layers (each file uses only files on lower lines):")
        for lvl in range(max(depth.values()) + 1):
            print(f"  {lvl:>3}: " + ", ".join(sorted(name(v) for v in mods if depth[v] == lvl and v != ())))
        print("  no import cycle")
    long = []
    for f in files:
        lines = f.read_text().splitlines()
        n = len(lines)
        for i, line in enumerate(lines):
            if line.strip() == "#[cfg(test)]":
                n = i
                break
        if n > MAX_LINES:
            long.append((f.relative_to(ROOT), n))
    biggest = max(((f.relative_to(ROOT), len(f.read_text().splitlines())) for f in files), key=lambda x: x[1])
    if long:
        ok = False
        for f, n in long:
            print(f"  TOO LONG: {f} has {n} lines before its tests (limit {MAX_LINES})")
    else:
        print(f"  no source file over {MAX_LINES} lines before its tests (largest: {biggest[0]}, {biggest[1]} lines in all)")
    wgpu_files = [str(f.relative_to(ROOT)) for f in files if "wgpu::" in re.sub(r"//[^\n]*", "", f.read_text())]
    print(f"  files naming wgpu:: ({len(wgpu_files)}, limit {MAX_WGPU_FILES}): {', '.join(wgpu_files)}")
    if len(wgpu_files) > MAX_WGPU_FILES:
        ok = False
    root = sorted(f.name for f in SRC.glob("*.rs"))
    print(f"  src/ root: {len(root)} .rs files (limit {MAX_ROOT_FILES}): {', '.join(root)}")
    if len(root) > MAX_ROOT_FILES:
        ok = False
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
    lib_deps = cargo.get("dependencies", {})
    if "anyhow" in lib_deps:
        ok = False
        print("  anyhow IS a library dependency")
    else:
        dev = "anyhow" in cargo.get("dev-dependencies", {})
        print(f"  anyhow is not a library dependency{' (dev-dependency only)' if dev else ''}")
    print("structure: OK" if ok else "structure: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
