#!/bin/bash
# ab.sh OLD NEW: CPU per seed of two simulator test binaries (each from
# `go -C chaos test -trimpath -c -o FILE ./sim`), run at the same time, each
# pinned to its own core with GOMAXPROCS=1, the cores swapped every pair, so
# that this VM's drift (±30 % within minutes) hits both alike. For each
# scenario, PAIRS pairs of SEEDS seeds; prints each pair's user+sys CPU, then
# per scenario the mean CPU per seed of each and NEW/OLD as the geometric
# mean of the pairs' ratios with a 95 % t interval. docs/simulator.md (Speed)
# records its results. Needs two cores, taskset and python3.
#
#   chaos/sim/ab.sh /tmp/old.test /tmp/new.test
#   PAIRS=8 SEEDS=300 SCEN="watchdog-mixed failover" chaos/sim/ab.sh OLD NEW
set -eu
[ $# -eq 2 ] || { echo "usage: $0 OLD NEW" >&2; exit 2; }
A=$1 B=$2
SEEDS=${SEEDS:-300}
PAIRS=${PAIRS:-8}
SCEN=${SCEN:-"watchdog-mixed fair-quorum5 failover quorum5-restart cluster-failover quorum5-fenced"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for s in $SCEN; do
	for p in $(seq 1 "$PAIRS"); do
		if [ $((p % 2)) -eq 1 ]; then ca=0 cb=1; else ca=1 cb=0; fi
		GOMAXPROCS=1 /usr/bin/time -o "$tmp/a" -f "%U %S" taskset -c $ca "$A" -test.run 'TestSim$' -scenario "$s" -seeds "$SEEDS" >/dev/null 2>&1 &
		GOMAXPROCS=1 /usr/bin/time -o "$tmp/b" -f "%U %S" taskset -c $cb "$B" -test.run 'TestSim$' -scenario "$s" -seeds "$SEEDS" >/dev/null 2>&1 &
		wait
		echo "scenario=$s pair=$p A=$(tail -1 "$tmp/a") B=$(tail -1 "$tmp/b")" | tee -a "$tmp/log"
	done
done
python3 - "$tmp/log" "$SEEDS" <<'EOF'
import collections, math, re, statistics, sys
# 97.5 % quantiles of Student's t by degrees of freedom
T = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 15: 2.13, 20: 2.09}
pairs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.search(r'scenario=(\S+) pair=\d+ A=([\d.]+) ([\d.]+) B=([\d.]+) ([\d.]+)', line)
    if m:
        pairs[m[1]].append((float(m[2]) + float(m[3]), float(m[4]) + float(m[5])))
seeds = int(sys.argv[2])
for s, v in pairs.items():
    lr = [math.log(b / a) for a, b in v]
    mean = statistics.mean(lr)
    if len(lr) > 1:
        t = T.get(len(lr) - 1, 2.0)
        half = t * statistics.stdev(lr) / math.sqrt(len(lr))
        ci = f"[{math.exp(mean - half):.2f}, {math.exp(mean + half):.2f}]"
    else:
        ci = "(one pair: no interval)"
    print(f"{s}: OLD {statistics.mean(a for a, _ in v) / seeds * 1000:.1f} ms/seed, "
          f"NEW {statistics.mean(b for _, b in v) / seeds * 1000:.1f}: NEW/OLD {math.exp(mean):.2f} {ci} ({len(v)} pairs)")
EOF
