#!/usr/bin/env python3
"""Import loops among a crate's top-level modules, and imports of the benchmark crate.

A module's edges are the other top-level modules it names (`crate::x` in a `use` or a path),
test code excluded (`tests.rs`, `*_tests.rs` and files in a `src/**/tests/` folder, and
`#[cfg(test)]` modules). A loop is a cycle in that
graph; the script prints each strongly connected group of more than one module and exits 1.
Usage: python3 scripts/imports.py [crates/broker/src ...]
"""
import re
import sys
from pathlib import Path

from rustsrc import is_test_file, product_lines, strip

roots = sys.argv[1:] or ['crates/broker/src', 'crates/core/src', 'crates/client/src']
REF = re.compile(r'\bcrate::([a-z_]+)')
GROUP = re.compile(r'use crate::\{([^;]*)\}', re.S)


def product_text(path):
    return '\n'.join(strip(line) for _, line in product_lines(path.read_text().splitlines()))


def module_of(root, path):
    rel = path.relative_to(root)
    return rel.parts[0].removesuffix('.rs')


bad = 0
for root in map(Path, roots):
    graph = {}
    for path in root.rglob('*.rs'):
        if is_test_file(path):
            continue
        m = module_of(root, path)
        if m in ('lib', 'main'):
            continue
        text = product_text(path)
        names = set(REF.findall(text))
        for group in GROUP.findall(text):
            names |= {n.strip().split('::')[0] for n in re.split(r',(?![^{]*\})', group) if n.strip()}
        if 'kafka_delay_bench' in text:
            print(f'{path}: imports the benchmark crate')
            bad += 1
        graph.setdefault(m, set()).update(n for n in names if n != m and n not in ('self', 'super'))
    # Tarjan's strongly connected components.
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
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
            comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    for comp in comps:
        if len(comp) > 1:
            edges = sorted(f'{a} -> {b}' for a in comp for b in graph[a] if b in comp)
            print(f'{root}: import loop among {sorted(comp)}: ' + ', '.join(edges))
            bad += 1
sys.exit(1 if bad else 0)
