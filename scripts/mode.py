#!/usr/bin/env python3
r"""The durability mode stays in its module. Outside `durability/`, the mechanisms it drives
(`changelog/`, `txn/`) and the flags that choose it (`config/`), no product code of the broker
names the mode's flags or state, so none can branch on whether the changelog or transactions
are on: ingest, the publisher and the admin API call the mode's parts (`ingest::Durable`,
`ingest::Rebalance`, `publish::Delivery`, `admin::Cluster`) and never ask which mode runs.
(`txn::Out`, a record to write in a transaction, is plain data.)

Anyone can run the same check by hand:
  grep -rnE 'cluster\.changelog\b|transactional_id|exactly_once|standby_replicas|\bHandoff\b|\bTransactions\b|crate::txn::[a-zA-Z]|changelog::handoff' \
    crates/broker/src --include=*.rs | grep -vE '^crates/broker/src/(durability|changelog|txn|config)/|txn::Out'
Usage: python3 scripts/mode.py
"""
import re
import sys
from pathlib import Path

from rustsrc import is_test_file, product_lines, strip

ROOT = Path('crates/broker/src')
ALLOWED = ('durability', 'changelog', 'txn', 'config')
# The mode's flags, its state, and the mechanisms only the mode may drive.
MODE = re.compile(
    r'cluster\.changelog\b|transactional_id|exactly_once|standby_replicas'
    r'|\bHandoff\b|\bTransactions\b|crate::txn::(?!Out\b)|changelog::handoff'
)

bad = 0
for path in sorted(ROOT.rglob('*.rs')):
    rel = path.relative_to(ROOT)
    if rel.parts[0] in ALLOWED or is_test_file(path):
        continue
    for n, line in product_lines(path.read_text().splitlines()):
        for m in MODE.finditer(strip(line)):
            print(f'{path}:{n}: names the durability mode ({m.group(0)}); '
                  f'call the mode\'s part instead (crate::durability)')
            bad += 1
if bad:
    sys.exit(1)
print('mode: no code outside durability/ branches on the durability mode')
