#!/usr/bin/env python3
"""Paired per-round ratios ours/peer from a make bench raw.txt.
Each benchmark line appears once per round, in order; round i of ours is paired
with round i of the peer. Prints, per case: n, median ratio, the 95% t-interval
of the geometric mean of the per-round ratios, and the min-max."""
import sys, re, math, statistics
from collections import defaultdict
T95 = {2:12.71,3:4.30,4:3.18,5:2.78,6:2.57,7:2.45,8:2.36,9:2.31,10:2.26}
rows = defaultdict(list)   # (name) -> list of dict metrics, in order
for line in open(sys.argv[1]):
    if not line.startswith('Benchmark'): continue
    f = line.split()
    if len(f) < 4 or not f[1].isdigit(): continue
    m = {'ns/op': float(f[2])}
    for v, u in zip(f[2::2], f[3::2]):
        try: m[u] = float(v)
        except ValueError: pass
    rows[f[0]].append(m)
def get(name): return rows.get(name, [])
def ratio(ours, peer, unit='ns/op'):
    a, b = get(ours), get(peer)
    n = min(len(a), len(b))
    if n == 0: return None
    rs = [a[i][unit]/b[i][unit] for i in range(n) if b[i].get(unit)]
    n = len(rs)
    logs = [math.log(r) for r in rs]
    gm = math.exp(statistics.mean(logs))
    if n >= 2:
        h = T95.get(n, 2.0) * statistics.stdev(logs) / math.sqrt(n)
        lo, hi = math.exp(statistics.mean(logs)-h), math.exp(statistics.mean(logs)+h)
    else: lo = hi = gm
    return n, statistics.median(rs), gm, lo, hi, min(rs), max(rs)
pairs = [l.split(',') for l in sys.argv[2:]]
for p in pairs:
    ours, peer = p[0], p[1]
    unit = p[2] if len(p) > 2 else 'ns/op'
    r = ratio(ours, peer, unit)
    if r is None: print(f'{ours} / {peer} [{unit}]: no data'); continue
    n, med, gm, lo, hi, mn, mx = r
    print(f'{ours} / {peer} [{unit}]: n={n} median {med:.3f} geomean {gm:.3f} 95% CI [{lo:.3f}, {hi:.3f}] range [{mn:.3f}, {mx:.3f}]')
