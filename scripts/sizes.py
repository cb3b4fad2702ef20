#!/usr/bin/env python3
"""Product code over the size limits: files over 500 lines and functions over 80, tests excluded.

A test module (`#[cfg(test)] mod ... {}`) and test files (tests.rs, *_tests.rs, a `src/**/tests/`
folder) are not product code. The
function scan matches braces; it ignores braces in strings and comments well enough for this
code base.
Product code is the core, the broker and the client; the benchmark crate is a lab and is not
checked. Usage: python3 scripts/sizes.py [FILE_LIMIT] [FN_LIMIT]
"""
import re
import sys
from pathlib import Path

from rustsrc import is_test_file, product_lines, strip

FILE_LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 500
FN_LIMIT = int(sys.argv[2]) if len(sys.argv) > 2 else 80
FN = re.compile(r'^\s*(pub(\([a-z]+\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)')


bad = 0
PRODUCT = ('core', 'broker', 'client')
for path in sorted(p for c in PRODUCT for p in Path('crates', c).glob('src/**/*.rs')):
    if is_test_file(path):
        continue
    lines = path.read_text().splitlines()
    prod = product_lines(lines)
    if len(prod) > FILE_LIMIT:
        print(f'{path}: {len(prod)} lines of product code')
        bad += 1
    i = 0
    while i < len(prod):
        n, line = prod[i]
        m = FN.match(line)
        if m and not strip(line).rstrip().endswith(';'):
            depth, j, opened = 0, i, False
            while j < len(prod):
                s = strip(prod[j][1])
                depth += s.count('{') - s.count('}')
                opened = opened or '{' in s
                if opened and depth <= 0:
                    break
                j += 1
            length = j - i + 1
            if length > FN_LIMIT:
                print(f'{path}:{n}: fn {m.group(6)} is {length} lines')
                bad += 1
        i += 1
sys.exit(1 if bad else 0)
