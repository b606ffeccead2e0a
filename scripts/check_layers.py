#!/usr/bin/env python3
"""Checks that the product code includes only downward.

    check_layers.py [ROOT]

The order of the layers is the one docs/architecture.md writes in its
```layers block: one line per level, top down; a folder includes only
itself and the folders of the lines below it, and folders on one line
(side by side) include neither other. Public headers (`#include "troupe/..."`,
include/troupe/) may be included from anywhere. scripts/layer_exceptions.txt
lists the includes allowed against the order, each with its reason:

    FILE -> INCLUDED    # why

Prints every include against the order and exits 1 when there is one (or an
exception that no longer matches an include), 0 otherwise.
"""

import pathlib
import re
import sys

SOURCES = ("*.cpp", "*.hpp", "*.cu", "*.cuh", "*.h")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_order(root):
    text = (root / "docs" / "architecture.md").read_text()
    m = re.search(r"```layers\n(.*?)```", text, re.S)
    if not m:
        sys.exit("check_layers: docs/architecture.md has no ```layers block")
    level = {}
    for i, line in enumerate(l for l in m.group(1).splitlines() if l.strip()):
        for folder in line.split("#")[0].split():
            level[folder.rstrip("/")] = i
    return level


def read_exceptions(root):
    allowed = {}
    path = root / "scripts" / "layer_exceptions.txt"
    if not path.exists():
        return allowed
    for n, line in enumerate(path.read_text().splitlines(), 1):
        body, _, why = line.partition("#")
        if not body.strip():
            continue
        src, arrow, inc = body.partition("->")
        if not arrow or not why.strip():
            sys.exit(f"check_layers: {path}:{n}: write 'FILE -> INCLUDED  # why'")
        allowed[(src.strip(), inc.strip())] = why.strip()
    return allowed


def folder_of(path, level):
    """The layer a file or an include belongs to: its longest known folder prefix."""
    parts = pathlib.PurePosixPath(path).parts
    for k in range(len(parts) - 1, 0, -1):
        f = "/".join(parts[:k])
        if f in level:
            return f
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    level = read_order(root)
    allowed = read_exceptions(root)
    used = set()
    bad = []
    for folder in sorted(level):
        for pattern in SOURCES:
            for f in sorted((root / folder).rglob(pattern)):
                src = f.relative_to(root).as_posix()
                if folder_of(src, level) != folder:
                    continue  # a file of a nested layer (inline/shm) is checked there
                for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                    m = INCLUDE.match(line)
                    if not m or m.group(1).startswith("troupe/"):
                        continue
                    target = folder_of(m.group(1), level)
                    if target is None or target == folder or target.startswith(folder + "/"):
                        continue
                    if level[target] > level[folder] or (
                            folder.startswith(target + "/") and level[target] >= level[folder]):
                        continue  # below, or the enclosing layer of a nested one
                    key = (src, m.group(1))
                    if key in allowed:
                        used.add(key)
                        continue
                    where = "beside" if level[target] == level[folder] else "above"
                    bad.append(f"{src}:{n}: includes {m.group(1)} ({target}/ is {where} {folder}/)")
    stale = [f"{s} -> {i}" for (s, i) in allowed if (s, i) not in used]
    for b in bad:
        print(b)
    for s in stale:
        print(f"scripts/layer_exceptions.txt: '{s}' matches no include any more: remove it")
    checked = ", ".join(sorted(level, key=lambda f: (level[f], f)))
    print(f"check_layers: {len(bad)} include(s) against the order, {len(allowed)} exception(s) "
          f"({checked})")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())
