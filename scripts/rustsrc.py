"""What the project's source checks (imports.py, sizes.py, mode.py) read: a Rust file's product
lines, with `#[cfg(test)]` modules left out, a line with its strings and comment blanked, and
whether a file is test code."""
import re


def strip(line):
    """The line without string or char literals and without its comment."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split('//')[0]


def product_lines(lines):
    """(number, line) for every line outside `#[cfg(test)] mod x { ... }`; `mod x;` is skipped."""
    out, skip, depth, i = [], False, 0, 0
    while i < len(lines):
        line = lines[i]
        if not skip and line.strip() == '#[cfg(test)]' and i + 1 < len(lines) and re.match(r'\s*mod \w+', lines[i + 1]):
            if lines[i + 1].rstrip().endswith(';'):
                i += 2
                continue
            skip, depth = True, 0
            i += 1
            continue
        if skip:
            depth += strip(line).count('{') - strip(line).count('}')
            if depth <= 0 and '}' in line:
                skip = False
            i += 1
            continue
        out.append((i + 1, line))
        i += 1
    return out


def is_test_file(path):
    """A file of test code: named tests.rs or *_tests.rs, or inside a `tests/` folder of a
    crate's `src/` (a module's tests split by topic)."""
    parts = path.parts
    in_src_tests = 'src' in parts and 'tests' in parts[parts.index('src') + 1:-1]
    return path.name == 'tests.rs' or path.name.endswith('_tests.rs') or in_src_tests
