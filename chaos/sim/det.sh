#!/bin/sh
# det.sh measures how exactly the simulator replays a seed: it builds one
# test binary of this tree, runs seeds FIRST..LAST of every scenario of
# every rotation (lock, idem, fence) with -replays REPLAYS, and prints one
# line per (scenario, seed) pair with the number of distinct canonical
# histories its runs gave (1: exact), then the pairs that were not exact
# (with TestSim's summary: verdicts, each history's count) and a total per
# rotation. docs/simulator.md (Determinism) records its results.
#
#   chaos/sim/det.sh                  # seeds 1-20, -replays 10, 2 at once
#   DET_SEEDS="1 20" DET_REPLAYS=10 DET_JOBS=2 DET_ROTATIONS="lock idem fence" \
#   DET_SCENARIOS="idem-quorum idem-mixed" chaos/sim/det.sh
#
# DET_SCENARIOS, when set, runs only those scenarios (of the rotations
# named). Every pair is one process running its replays one after the
# other; DET_JOBS processes run at once.
set -eu

seeds=${DET_SEEDS:-1 20}
replays=${DET_REPLAYS:-10}
jobs=${DET_JOBS:-2}
rotations=${DET_ROTATIONS:-lock idem fence}
only=${DET_SCENARIOS:-}

dir=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/sim.test
(cd "$dir" && GOWORK=off go test -c -o "$bin" .)

# One line per pair to run: rotation scenario seed.
for rot in $rotations; do
	flag=$rot
	[ "$rot" = lock ] && flag=
	for sc in $(cd "$dir" && "$bin" -test.run 'TestSim$' -rotation "$flag" -list | sed -n "s/^scenario //p"); do
		if [ -n "$only" ] && ! echo " $only " | grep -q " $sc "; then
			continue
		fi
		for s in $(seq $seeds); do
			echo "$rot $sc $s"
		done
	done
done >"$tmp/pairs"

# Each pair prints: rotation scenario seed distinct-histories summary.
export bin replays dir
xargs -P "$jobs" -L 1 sh -c '
	out=$(cd "$dir" && "$bin" -test.run "TestSim\$" -test.v -scenario "$1" -seed "$2" -replays "$replays" 2>&1 | grep "distinct histories" || true)
	n=$(echo "$out" | sed -n "s/.*; \([0-9]*\) distinct histories.*/\1/p")
	echo "$0 $1 $2 ${n:-ERROR} ${out#*: }"
' <"$tmp/pairs" | sort -k1,1 -k2,2 -k3,3n >"$tmp/out"

awk '{ print $1, $2, $3, $4 }' "$tmp/out"
echo
echo "not exact (rotation scenario seed histories: summary):"
awk '$4 != 1 { print "  " $0 }' "$tmp/out"
echo
awk -v r="$replays" '
	{ pairs[$1]++; if ($4 == 1) exact[$1]++; all++; if ($4 == 1) ex++ }
	END {
		for (k in pairs) printf "%s: %d of %d pairs exact (-replays %d)\n", k, exact[k], pairs[k], r
		printf "total: %d of %d pairs exact\n", ex, all
	}' "$tmp/out" | sort
