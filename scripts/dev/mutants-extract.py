#!/usr/bin/env python3
"""Copies a rustfmt-formatted Rust test file without some of its top-level items, for
scripts/dev/mutants.sh (the CPU halves of the integration tests, in a small crate without the GPU).

    mutants-extract.py FILE [--drop NAME ...] [--from NAME] [--keep NAME ...]
                            [--replace OLD NEW ...] > OUT

A top-level item starts at column 0 (with the doc comments and attributes above it) and ends
at the next line that is `}` or `};` at column 0, or is one line ending in `;`. `--drop` leaves
out the items named NAME (a function, struct, impl, use of a path ending in NAME, ...);
`--from NAME` leaves out NAME and every item after it; `--keep` keeps only the named items
(and every `use`/`mod`); `--replace` rewrites text in what is kept (exact match required:
a replacement that no longer matches stops the script, so the copy never drifts silently).
"""
import re
import sys

ITEM = re.compile(
    r"^(?:pub(?:\([a-z]+\))?\s+)?(?:async\s+)?(fn|struct|enum|impl(?:<[^>]*>)?|const|static|mod|use|type|trait)\s+([A-Za-z_][\w:]*)"
)


def items(lines):
    """(name, kind, text) per top-level item; loose lines (comments, blanks) get name None."""
    out, pending, i = [], [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("///", "#[", "#![", "//!")) or not line.strip() or line.startswith("//"):
            pending.append(line)
            i += 1
            continue
        m = ITEM.match(line)
        if not m:
            raise SystemExit(f"mutants-extract: unrecognised top-level line {i + 1}: {line!r}")
        kind, name = m.group(1), m.group(2)
        if kind != "use":
            name = name.split(":")[0]
        body = [line]
        i += 1
        if not line.rstrip().endswith(";"):
            while i < len(lines) and lines[i].rstrip() not in ("}", "};"):
                body.append(lines[i])
                i += 1
            if i < len(lines):
                body.append(lines[i])
                i += 1
        # doc comments and attributes directly above belong to the item
        k = len(pending)
        while k > 0 and pending[k - 1].startswith(("///", "#[")):
            k -= 1
        if pending[:k]:
            out.append((None, None, "".join(pending[:k])))
        out.append((name, kind, "".join(pending[k:] + body)))
        pending = []
    if pending:
        out.append((None, None, "".join(pending)))
    return out


def main(argv):
    path, drop, keep, start, repl = argv[0], set(), None, None, []
    args = argv[1:]
    while args:
        a = args.pop(0)
        if a == "--drop":
            drop.add(args.pop(0))
        elif a == "--keep":
            keep = (keep or set()) | {args.pop(0)}
        elif a == "--from":
            start = args.pop(0)
        elif a == "--replace":
            repl.append((args.pop(0), args.pop(0)))
        else:
            raise SystemExit(f"mutants-extract: unknown argument {a}")
    with open(path) as f:
        parsed = items(f.readlines())
    text, seen, cut = [], set(), False
    for name, kind, chunk in parsed:
        if name is not None and (name == start or (kind == "use" and start and start in chunk)):
            cut = True
            seen.add(start)
        if cut:
            continue
        if name is not None:
            seen.add(name)
            if name in drop:
                continue
            if keep is not None and kind not in ("use", "mod") and name not in keep:
                continue
        text.append(chunk)
    missing = (drop | (keep or set()) | ({start} if start else set())) - seen
    if missing:
        raise SystemExit(f"mutants-extract: {path} has no item {sorted(missing)}")
    out = "".join(text)
    for old, new in repl:
        if old not in out:
            raise SystemExit(f"mutants-extract: {path}: {old!r} not found")
        out = out.replace(old, new)
    sys.stdout.write(out)


main(sys.argv[1:])
