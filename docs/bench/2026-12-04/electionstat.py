#!/usr/bin/env python3
"""Ratios of election.txt, per run (a line '## run N' starts each):
BenchmarkElection's cases ours/peer, round i of ours over round i of the
peer (-count rounds, each case one after the other), geometric mean with
its 95% t-interval and the range; and BenchmarkElectionPaired's metrics
(each pair timed op by op), median and range over the rounds.
    python3 electionstat.py election.txt"""
import sys, re, math, statistics as st, collections

T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}
PAIRS = [('redlease/op=term', 'redsync/op=term'), ('redlease/op=term', 'redislock/op=term'),
         ('redlease-nokeeper/op=term', 'redsync/op=term'), ('redlease-nokeeper/op=term', 'redislock/op=term'),
         ('redlease/op=term', 'redlease-nokeeper/op=term'), ('redlease/op=leader', 'raw/op=leader')]

runs = collections.OrderedDict()
run = None
for line in open(sys.argv[1]):
    if line.startswith('## run'):
        run = line.split(',')[0][3:]
        runs[run] = collections.defaultdict(list)
    if run is None or not line.startswith('Benchmark'):
        continue
    f = line.split()
    m = {}
    for v, u in zip(f[2::2], f[3::2]):
        try:
            m[u] = float(v)
        except ValueError:
            pass
    runs[run][re.sub(r'-\d+$', '', f[0])].append(m)

for run, rows in runs.items():
    print(f'== {run}')
    for o, p in PAIRS:
        a, b = rows.get('BenchmarkElection/lib=' + o, []), rows.get('BenchmarkElection/lib=' + p, [])
        parts = []
        for u in ('ns/op', 'allocs/op'):
            rs = [x[u] / y[u] for x, y in zip(a, b) if y.get(u)]
            if len(rs) < 2:
                continue
            l = [math.log(r) for r in rs]
            h = T95.get(len(l), 2.0) * st.stdev(l) / math.sqrt(len(l))
            g = st.mean(l)
            parts.append(f'{u} {math.exp(g):.2f} [{math.exp(g - h):.2f}, {math.exp(g + h):.2f}] range {min(rs):.2f}-{max(rs):.2f}')
        if parts:
            print(f'  sequential {o} / {p} (n={len(a)}): ' + '; '.join(parts))
    for name, ms in rows.items():
        if not name.startswith('BenchmarkElectionPaired/'):
            continue
        col = lambda u: [m[u] for m in ms if u in m]
        rng = lambda u: f'{st.median(col(u)):.2f} ({min(col(u)):.2f}-{max(col(u)):.2f})'
        print(f"  paired {name[len('BenchmarkElectionPaired/'):]:40s} mean-ratio {rng('mean-ratio')}  p50-ratio {rng('p50-ratio')}"
              f"  p50 {st.median(col('ours-p50-us')):.0f} vs {st.median(col('raw-p50-us')):.0f} us"
              f"  pair allocs {st.median(col('allocs/op')):.0f}  server-us/pair {st.median(col('server-us/op')):.1f}"
              f"  retried/op max {max(col('retried/op')):g}  (n={len(ms)})")
