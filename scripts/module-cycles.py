#!/usr/bin/env python3
"""Prints the import circles among a crate's modules; prints nothing when there are none.

Usage: python3 scripts/module-cycles.py cuda-rt/src [LEVEL]

LEVEL 1 (the default) looks at the top-level modules (`memory`, `stream`, ...);
LEVEL 2 also tells each directory module's submodules apart (`memory::pool`,
`pinned::staging`, ...). An edge A -> B is a `crate::B` (or `$crate::B`) path, or a
`super::B` path naming a sibling module, in A's non-test code; comment lines and
everything from `#[cfg(test)] mod tests` on are skipped. Paths through the crate
root's re-exports (`crate::Device`) and plain relative paths (`child::Item`) are not
seen. Each circle is a strongly connected component with more than one module,
printed with its edges inside the component.

The rule it checks (DESIGN.md): a lower module never imports a higher one; the
layers are listed in the crate doc of cuda-rt/src/lib.rs.
"""
import collections
import os
import re
import sys

root = sys.argv[1]
level = int(sys.argv[2]) if len(sys.argv) > 2 else 1


def modpath(f):
    rel = os.path.relpath(f, root)[:-3].split('/')
    if rel[-1] in ('mod', 'lib'):
        rel = rel[:-1]
    return rel


edges = collections.defaultdict(set)
for dp, _, fs in os.walk(root):
    for fn in fs:
        if not fn.endswith('.rs'):
            continue
        f = os.path.join(dp, fn)
        mp = modpath(f)
        src = open(f).read()
        i = src.find('#[cfg(test)]\nmod tests')
        if i >= 0:
            src = src[:i]
        txt = '\n'.join(l for l in src.split('\n') if not l.strip().startswith('//'))
        me = mp[:level] if mp else ['lib']
        for m in re.finditer(r'crate::([a-z_][a-z0-9_]*)(?:::([a-z_][a-z0-9_]*))?', txt):
            tgt = [m.group(1)] + ([m.group(2)] if m.group(2) else [])
            tgt = tgt[:level]
            if tgt != me[:len(tgt)]:
                edges['::'.join(me)].add('::'.join(tgt))
        for m in re.finditer(r'\bsuper::([a-z_][a-z0-9_]*)', txt):
            tgt = (mp[:-1] + [m.group(1)])[:level]
            if tgt and tgt != me[:len(tgt)]:
                edges['::'.join(me)].add('::'.join(tgt))

# Tarjan's strongly connected components.
sys.setrecursionlimit(10000)
nodes = set(edges) | {t for v in edges.values() for t in v}
idx, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]


def visit(v):
    idx[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges.get(v, ()):
        if w not in idx:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            comps.append(sorted(comp))


for v in sorted(nodes):
    if v not in idx:
        visit(v)
for comp in comps:
    print("CYCLE:", comp)
    for a in comp:
        print("  ", a, "->", sorted(edges[a] & set(comp)))
