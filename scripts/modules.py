#!/usr/bin/env python3
"""No import circles in src/: neither between modules (files) nor between concept folders.

Each module's dependencies are the `crate::...` paths its code names (tests left out). A
circle between folders means a concept cannot be read, changed or moved without the other;
the fix is to move what both need into the lower one (see docs/architecture.md).
Prints the circles and exits 1 if there is any.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return "::".join(parts)


def modules():
    found = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".rs") and f != "lib.rs":
                path = os.path.join(folder, f)
                found[module_of(path)] = path
    return found


def dependencies(found):
    edges = {}
    for name, path in found.items():
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        text = re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", text, flags=re.S)
        deps = set()
        for m in re.finditer(r"crate::([a-z_]+(?:::[a-z_]+)*)", text):
            path_parts = m.group(1).split("::")
            for k in range(len(path_parts), 0, -1):
                candidate = "::".join(path_parts[:k])
                if candidate in found:
                    deps.add(candidate)
                    break
        deps.discard(name)
        edges[name] = deps
    return edges


def circles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    found = modules()
    edges = dependencies(found)
    failed = False
    for depth, what in ((None, "modules"), (1, "folders")):
        graph = {}
        for name, deps in edges.items():
            top = name if depth is None else "::".join(name.split("::")[:depth])
            graph.setdefault(top, set())
            for d in deps:
                dtop = d if depth is None else "::".join(d.split("::")[:depth])
                if dtop != top:
                    graph[top].add(dtop)
        found_here = circles(graph)
        for comp in found_here:
            failed = True
            print(f"import circle between {what}: {' <-> '.join(comp)}")
            top = (lambda n: n) if depth is None else (lambda n: n.split("::")[0])
            for n, ds in sorted(edges.items()):
                for d in sorted(ds):
                    if top(n) in comp and top(d) in comp and top(n) != top(d):
                        print(f"    {n} uses {d}")
        if not found_here:
            print(f"no import circle between the {len(graph)} {what} of src/")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
