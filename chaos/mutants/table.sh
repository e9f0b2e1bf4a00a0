#!/bin/bash
# table.sh: the simulator's power table. For each mutant (a library bug
# put back by a go build overlay: NN-name.patch here), build the
# chaos/sim test binary once with the overlay, run make test's simulator
# command (the lock rotation, -seeds 15000) with -stopfail from each
# starting seed, replay each first find, and print a markdown table.
#
#   chaos/mutants/table.sh                          # every mutant
#   chaos/mutants/table.sh 05-one-token 20-F1-extend-shortens
#
# Each mutant is NN-name.patch (a git diff against the library). It is
# applied afresh to ROOT's files on every run, so the overlay follows the
# tree it runs on; a patch that no longer applies gives a row saying so.
# The replacement files and the overlay JSON are written under OUT.
# 00-control has no patch: the tree as it is (it must not fail).
#
# Environment: ROOT (default: the git top level of the working directory),
# SEEDS (15000), FIRSTS ("1 100001 200001"), WORKERS (2), REPLAYS (5),
# OUT (raw logs; default a new directory under /tmp).
set -uo pipefail
export GOWORK=off
MUT=$(cd "$(dirname "$0")" && pwd)
ROOT=${ROOT:-$(git rev-parse --show-toplevel 2>/dev/null)}
[ -n "$ROOT" ] && [ -d "$ROOT/chaos/sim" ] || { echo "ROOT (the redlease tree) not found; set ROOT=" >&2; exit 2; }
ROOT=$(cd "$ROOT" && pwd)
SEEDS=${SEEDS:-15000}
FIRSTS=${FIRSTS:-"1 100001 200001"}
WORKERS=${WORKERS:-2}
REPLAYS=${REPLAYS:-5}
OUT=${OUT:-$(mktemp -d /tmp/redlease-mutants.XXXXXX)}
mkdir -p "$OUT"
BIN=$OUT/sim.test

if [ $# -gt 0 ]; then
	NAMES=("$@")
else
	NAMES=(00-control)
	for p in "$MUT"/[0-9][0-9]-*.patch; do
		NAMES+=("$(basename "$p" .patch)")
	done
fi

# overlay NAME: writes NAME's replacement files and overlay.json for ROOT;
# prints the json's path ("" for the control), or fails if the patch does
# not apply.
overlay() {
	local name=$1 patchf=$MUT/$1.patch dir=$OUT/$1 tmp f flat entries=""
	[ "$name" = 00-control ] && { echo ""; return 0; }
	mkdir -p "$dir"
	tmp=$(mktemp -d)
	for f in $(sed -n 's#^+++ b/##p' "$patchf"); do
		mkdir -p "$tmp/$(dirname "$f")"
		cp "$ROOT/$f" "$tmp/$f" || { rm -rf "$tmp"; return 1; }
	done
	if ! patch -s -p1 -d "$tmp" <"$patchf" >"$OUT/$name.patch.log" 2>&1; then
		rm -rf "$tmp"
		return 1
	fi
	for f in $(sed -n 's#^+++ b/##p' "$patchf"); do
		flat=${f//\//_}
		cp "$tmp/$f" "$dir/$flat"
		entries+="${entries:+,}\"$ROOT/$f\":\"$dir/$flat\""
	done
	rm -rf "$tmp"
	echo "{\"Replace\":{$entries}}" >"$dir/overlay.json"
	echo "$dir/overlay.json"
}

load1() { cut -d' ' -f1 /proc/loadavg; }

ROWS=()
NOTES=()
echo "# power table: ROOT=$ROOT ($(git -C "$ROOT" rev-parse --short HEAD) $(git -C "$ROOT" status --porcelain | grep -qv '^??' && echo dirty)), SEEDS=$SEEDS, WORKERS=$WORKERS, $(date -u +%FT%TZ)" >&2
echo "# raw logs: $OUT" >&2
for name in "${NAMES[@]}"; do
	if ! json=$(overlay "$name"); then
		ROWS+=("| $name | - | patch does not apply to ROOT (see $OUT/$name.patch.log) | | | | | | | |")
		continue
	fi
	# A patch whose first line is "# rotation: idem" runs the idempotency
	# rotation (IDEM_SEEDS seeds, default 4,000, as make test); "#
	# rotation: elect" the election rotation (ELECT_SEEDS, default 2,000,
	# as make test).
	rot=() seeds=$SEEDS rottxt=""
	if [ "$name" != 00-control ] && head -1 "$MUT/$name.patch" | grep -q '^# rotation: idem'; then
		rot=(-rotation idem) seeds=${IDEM_SEEDS:-4000} rottxt=" -rotation idem"
	elif [ "$name" != 00-control ] && head -1 "$MUT/$name.patch" | grep -q '^# rotation: elect'; then
		rot=(-rotation elect) seeds=${ELECT_SEEDS:-2000} rottxt=" -rotation elect"
	fi
	ovflag=() ovtxt=""
	if [ -n "$json" ]; then
		ovflag=(-overlay "$json")
		ovtxt=" -overlay $json"
	fi
	b0=$(date +%s.%N)
	if ! go -C "$ROOT/chaos" test -c "${ovflag[@]}" -o "$BIN" ./sim >"$OUT/$name.build.log" 2>&1; then
		ROWS+=("| $name | - | build failed (see $OUT/$name.build.log) | | | | | | | |")
		continue
	fi
	b1=$(date +%s.%N)
	echo "$name: built in $(printf %.0f "$(echo "$b1 - $b0" | bc)") s" >&2
	for first in $FIRSTS; do
		log=$OUT/$name-first$first.log
		up0=$(uptime | sed 's/.*load average: //')
		t0=$(date +%s.%N)
		(cd "$ROOT/chaos/sim" && "$BIN" -test.run 'TestSim$' -test.count=1 -test.v "${rot[@]}" -seeds "$seeds" -stopfail -first "$first" -workers "$WORKERS") >"$log" 2>&1
		rc=$?
		t1=$(date +%s.%N)
		up1=$(uptime | sed 's/.*load average: //')
		wall=$(printf %.1f "$(echo "$t1 - $t0" | bc)")
		ran=$(sed -n 's/.*sim_test.go:[0-9]*: \([0-9]*\) seeds in .*/\1/p' "$log" | tail -1)
		hit=$(grep -a -m1 -E 'seed [0-9]+ \([a-z0-9-]+\) FAILED after [0-9]+ seeds in' "$log")
		if [ -z "$hit" ]; then
			# No seed failed; the run's end-of-run checks (examined counts,
			# hazard ceilings) may still have failed the test.
			other=$(grep -a -E 'examined nothing|has no ceiling|above its ceiling|panic:' "$log" | head -3 | sed 's/^ *//; s/|/\\|/g' | tr '\n' ' ')
			haz=$(sed -n 's/.*sim_test.go:[0-9]*: [0-9]* seeds in [^,]*, \([0-9]*\) hazards.*/\1/p' "$log" | tail -1)
			verdict="**not found** in ${ran:-?} seeds, ${haz:-?} hazard seeds, test $([ $rc = 0 ] && echo PASS || echo FAIL)${other:+: $other}"
			ROWS+=("| $name | $first | $verdict | - | - | - | - | - | $wall | $up0 → $up1 |")
			echo "$name first=$first: not found (${ran:-?} seeds, $wall s)" >&2
			continue
		fi
		seed=$(echo "$hit" | sed -E 's/.*seed ([0-9]+) \(.*/\1/')
		scen=$(echo "$hit" | sed -E 's/.*seed [0-9]+ \(([a-z0-9-]+)\).*/\1/')
		after=$(echo "$hit" | sed -E 's/.*FAILED after ([0-9]+) seeds in ([^;]+);.*/\1/')
		intime=$(echo "$hit" | sed -E 's/.*FAILED after ([0-9]+) seeds in ([^;]+);.*/\2/')
		# The invariants that caught it: the seed's non-hazard violations,
		# from one -seed run (it prints each violation).
		rlog=$OUT/$name-seed$seed.log
		(cd "$ROOT/chaos/sim" && "$BIN" -test.run 'TestSim$' -test.v -scenario "$scen" -seed "$seed") >"$rlog" 2>&1
		invs=$(grep -a -E 'sim_test.go:[0-9]+: [a-z-]+(/[a-z]+)? at [0-9.]+ms: ' "$rlog" | grep -v '\[hazard:' |
			sed -E 's/.*sim_test.go:[0-9]+: ([a-z/-]+) at .*/\1/' | sort | uniq -c | awk '{printf "%s%s×%s", sep, $2, $1; sep=", "}')
		[ -n "$invs" ] || invs="(replay passed; $(grep -a -B30 -m1 -F "$hit" "$log" | grep -a -E ': [a-z-]+ at [0-9.]+ms: ' | grep -v '\[hazard:' | sed -E 's/.*sim_test.go:[0-9]+: ([a-z/-]+) at .*/\1/' | sort -u | tr '\n' ' ')in the run)"
		plog=$OUT/$name-seed$seed-replays.log
		(cd "$ROOT/chaos/sim" && "$BIN" -test.run 'TestSim$' -test.v -scenario "$scen" -seed "$seed" -replays "$REPLAYS") >"$plog" 2>&1
		nfail=$(sed -nE 's/.*verdicts map\[(.*)\];.*/\1/p' "$plog" | grep -oE 'FAIL:[0-9]+' | cut -d: -f2)
		hist=$(sed -nE 's/.*; ([0-9]+) distinct (client-level )?histories.*/\1/p' "$plog")
		cmd="go -C chaos test ./sim -run 'TestSim\$' -scenario $scen -seed $seed$ovtxt"
		ROWS+=("| $name | $first | found: seed $seed ($scen) | $after | $intime | $invs | ${nfail:-0}/$REPLAYS (${hist:-?} hist.) | \`$cmd\` | $wall | $up0 → $up1 |")
		echo "$name first=$first: seed $seed ($scen) after $after seeds, $invs, replays ${nfail:-0}/$REPLAYS, $wall s" >&2
	done
done
rm -f "$BIN"
echo "| mutant | -first | result | seeds to the find | time to the find | caught by (non-hazard violations in the seed) | replays failing | replay | wall of the stopfail run (s) | load (1, 5, 15 min) before → after |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
