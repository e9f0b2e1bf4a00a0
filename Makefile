# redlease: the commands a fresh machine needs.
#   make test   vet, then every module's tests with -race (real redis-server processes) and the
#               simulator's budgets, side by side; each job's output and time when it ends
#   make demo   the settlement demo: exactly-once settlements on 5 in-process quorum nodes + SQLite
#   make bench  go test -bench, ours and the peers side by side, with -benchmem
#   make chaos  every fault scenario against real processes; table + HTML/SVG report in $(CHAOS_REPORT)
#   make sim    the seeded virtual-time simulation (chaos/sim) over SIM_SEEDS seeds, with a progress line
#   make slow   everything too slow for make test, one step after the other: make chaos, the bounds
#               table, full sizes (watchdog, retry storm, CLI's 10,000 locks), the simulator's full budgets
#
# The library is the root module; chaos (with chaos/sim), bench (with
# bench/plot), examples and cmd are modules of their own, each with a
# replace directive that points at this tree, so that their dependencies stay
# out of the library's module graph. Every target runs each module where it
# lives (go -C dir), and GOWORK=off keeps a go.work someone made for
# convenience from testing the modules against each other's versions.

SHELL := /bin/bash
GO    ?= go
export GOWORK := off
MODULES = . chaos bench examples cmd
COUNT ?= 8
BENCH ?= .
BENCH_OUT ?= docs/bench
BENCHTIME ?= 1s
BENCH_GROUPS = Quorum Single Contention Watchdog Idempotency Handoff LockSet Semaphore Election
# One-node groups run pinned to one CPU (client and server alike): on a small VM a
# cross-CPU wakeup costs more than the libraries differ, and where the scheduler
# puts the two processes changes from run to run. Empty BENCH_PIN: no pinning.
BENCH_ONE_NODE = Single|Idempotency|Election
# A group in none of BENCH_ONE_NODE, BENCH_MULTI_NODE, BENCH_HANDOFF, BENCH_BOTH runs in
# all three passes (the third at HANDOFFS iterations): list every new group in one of them.
BENCH_MULTI_NODE = Quorum|Contention|ContentionOneKey|ContentionSingle|Watchdog|LockSet|Semaphore
# Handoff runs a fixed number of handoffs per round (each waits a random
# 5–155 ms first), unpinned: a time-based benchtime gives too few for a p99.
BENCH_HANDOFF = Handoff
# IdempotencyPaired, SinglePaired and ElectionPaired run in both the unpinned and the
# pinned pass (each name says which: cpus=2 or cpus=1), never in the handoff pass's
# fixed count.
BENCH_BOTH = IdempotencyPaired|SinglePaired|ElectionPaired
HANDOFFS ?= 40
BENCH_PIN ?= taskset -c 0
BENCHSTAT_VERSION ?= v0.0.0-20260908200009-22c9c6c9d4da
BENCHSTAT ?= $(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin)/benchstat
CHAOS_REPORT ?= $(CURDIR)/.chaos-report

.PHONY: test demo bench chaos redis sim slow

# redis is on PATH, or installed here when we are root on Debian.
redis:
	@if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-sentinel >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing redis-server and redis-sentinel with apt-get"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-sentinel >/dev/null; \
	  else \
	    echo "redis-server (and redis-sentinel) must be on PATH for the tests: apt-get install redis-server redis-sentinel, then run make test again" >&2; \
	    exit 1; \
	  fi; \
	fi
	@redis-server --version

# test runs its jobs side by side (make -j): each module's vet, then its
# race tests, and the simulator's budgets without -race. Each job's output
# is printed whole when it ends (--output-sync), with its wall time; a
# failed job fails make test after the others have finished.
TEST_JOBS = test-root test-chaos test-cmd test-small test-sim
# TEST_TIMEOUT is make test's hang guard per test binary (go test's own
# default is 10 min): beside two other test runs, at load 20, the
# simulator's 10,000 seeds took more than 10 min and were stopped as hung,
# where they take 2-6 min beside yes > /dev/null x2.
TEST_TIMEOUT ?= 30m
# TRIM keeps the tree's directory out of what make test compiles (-trimpath),
# so that a clean clone finds the packages an earlier clone of the same
# source compiled in the build cache (the directory is part of a package's
# cache key otherwise): vet -race of the root module in a second clone took
# 1.3 s with it and 92 s without. File names in test output read
# github.com/redlease/redlease/... instead of the directory.
TRIM ?= -trimpath

test: redis
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory -j$(words x $(TEST_JOBS)) --output-sync=target $(TEST_JOBS); rc=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s wall, $$([ $$rc = 0 ] && echo ok || echo FAILED)"; exit $$rc

# The jobs of make test (also runnable alone).
.PHONY: test-vet vet-root vet-chaos vet-cmd vet-small $(TEST_JOBS)
# Each module is vetted with -race before its tests run: vet compiles every
# package the tests import (with their test files) to read its types, and
# with -race it compiles them as the race tests do, so nothing is compiled
# twice, once for vet and once for the tests (that cost 2.5 CPU-minutes with
# an empty cache). The vets run one after the other, in the order of the
# modules' test times: each finds what the one before compiled in the build
# cache, where vets side by side would each compile the same dependencies
# at the same time (with an empty cache they did, and make test took 14
# min). A module's tests start when its own vet has ended, beside the vets
# that follow. The simulator's job is not a race job: it starts at once and
# vets its own package without -race (the files behind //go:build !race).
vet-root:
	@$(GO) vet $(TRIM) -race ./... && echo "go vet -race: root module ok"
vet-chaos: vet-root
	@$(GO) -C chaos vet $(TRIM) -race ./... && echo "go vet -race: chaos module ok"
vet-cmd: vet-chaos
	@$(GO) -C cmd vet $(TRIM) -race ./... && echo "go vet -race: cmd module ok"
vet-small: vet-cmd
	@$(GO) -C bench vet $(TRIM) -race ./... && $(GO) -C examples vet $(TRIM) -race ./... && echo "go vet -race: bench and examples modules ok"
test-vet: vet-small

# ROOT_P is how many of the root module's test binaries run at once (go
# test's -p; its default is the number of CPUs). They spend most of their
# time waiting on real servers and real TTLs: on 2 cores, quiet, the module
# took 229 s with -p 2 and 129 s with -p 4, no package slower with 4
# (failover 95 s with 2, 85 s with 4).
ROOT_P ?= 4
test-root: vet-root
	@$(call timed,root module -race,$(GO) test $(TRIM) -race -count=1 -p $(ROOT_P) -timeout $(TEST_TIMEOUT) ./...)

test-chaos: vet-chaos
	@$(call timed,chaos module -race,$(GO) -C chaos test $(TRIM) -race -count=1 -timeout $(TEST_TIMEOUT) ./...)

test-cmd: vet-cmd
	@$(call timed,cmd module -race,$(GO) -C cmd test $(TRIM) -race -count=1 -timeout $(TEST_TIMEOUT) ./...)

test-small: vet-small
	@$(call timed,bench and examples modules -race,$(GO) -C bench test $(TRIM) -race -count=1 -timeout $(TEST_TIMEOUT) ./... && $(GO) -C examples test $(TRIM) -race -count=1 -timeout $(TEST_TIMEOUT) ./...)

test-sim:
	@$(call timed,simulator budgets,$(GO) -C chaos vet $(TRIM) ./sim/ && $(GO) -C chaos test $(TRIM) -count=1 -timeout $(TEST_TIMEOUT) ./sim/ -run 'TestSim$$|TestMatchPatterns$$' -seeds 15000 && \
	  $(GO) -C chaos test $(TRIM) -count=1 -timeout $(TEST_TIMEOUT) ./sim/ -run 'TestSim$$' -rotation idem -seeds 4000 && \
	  $(GO) -C chaos test $(TRIM) -count=1 -timeout $(TEST_TIMEOUT) ./sim/ -run 'TestSim$$' -rotation fence -seeds 900 && \
	  $(GO) -C chaos test $(TRIM) -count=1 -timeout $(TEST_TIMEOUT) ./sim/ -run 'TestSim$$' -rotation elect -seeds 2000)

# timed,NAME,COMMAND: runs COMMAND, then says how long NAME took (wall and
# CPU, children included) and how it ended.
timed = echo "== $(1)"; TIMEFORMAT="== $(1): %R s wall, %U s user + %S s sys CPU"; time ( $(2) ); rc=$$?; echo "== $(1): $$([ $$rc = 0 ] && echo ok || echo FAILED)"; exit $$rc

demo:
	$(GO) -C examples run ./settlement

# bench: COUNT rounds of every benchmark in ./bench (ours and the peers side by
# side on the same nodes), one round after the other so that a noisy moment hits
# every library alike; raw output, benchstat summaries and SVG charts in $(BENCH_OUT).
bench: redis
	@set -eo pipefail; \
	if [ ! -x "$(BENCHSTAT)" ]; then \
	  echo "installing benchstat $(BENCHSTAT_VERSION) into $(dir $(BENCHSTAT))"; \
	  GOBIN="$(dir $(BENCHSTAT))" $(GO) install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION); \
	fi; \
	mkdir -p $(BENCH_OUT); \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(GO) -C bench test -c -o "$$tmp/bench.test" .; \
	pin="$(BENCH_PIN)"; if [ "$$(nproc)" -lt 2 ] || ! command -v $${pin%% *} >/dev/null 2>&1; then pin=""; fi; \
	{ echo "date: $$(date -u +%Y-%m-%dT%H:%MZ)"; echo "nproc: $$(nproc)"; \
	  echo "cpu: $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"; \
	  echo "redis: $$(redis-server --version)"; echo "go: $$($(GO) version)"; \
	  echo "count: $(COUNT) rounds, benchtime: $(BENCHTIME), handoffs: $(HANDOFFS) per round"; \
	  echo "one-node groups ($(BENCH_ONE_NODE)) pinned with: $${pin:-nothing}"; } > $(BENCH_OUT)/machine.txt; \
	cat $(BENCH_OUT)/machine.txt; \
	run=("$$tmp/bench.test" -test.run '^$$' -test.bench '$(BENCH)' -test.benchmem -test.count 1 -test.benchtime $(BENCHTIME) -test.timeout 60m); \
	: > $(BENCH_OUT)/raw.txt; start=$$(date +%s); \
	for round in $$(seq 1 $(COUNT)); do \
	  echo "== round $$round of $(COUNT)"; \
	  "$${run[@]}" -test.skip '^Benchmark($(BENCH_ONE_NODE)|$(BENCH_HANDOFF))$$' | tee -a $(BENCH_OUT)/raw.txt; \
	  $$pin "$${run[@]}" -test.skip '^Benchmark($(BENCH_MULTI_NODE)|$(BENCH_HANDOFF))$$' | tee -a $(BENCH_OUT)/raw.txt; \
	  "$${run[@]}" -test.skip '^Benchmark($(BENCH_ONE_NODE)|$(BENCH_MULTI_NODE)|$(BENCH_BOTH))$$' -test.benchtime $(HANDOFFS)x | tee -a $(BENCH_OUT)/raw.txt; \
	done; \
	echo "benchmarks took $$(( $$(date +%s) - start )) s" | tee -a $(BENCH_OUT)/machine.txt; \
	$(BENCHSTAT) $(BENCH_OUT)/raw.txt > $(BENCH_OUT)/benchstat.txt; \
	for g in $(BENCH_GROUPS); do \
	  echo "### $$g: libraries side by side (vs base = the first column)"; echo; \
	  $(BENCHSTAT) -filter ".name:$$g" -col /lib $(BENCH_OUT)/raw.txt; echo; \
	done > $(BENCH_OUT)/benchstat-by-lib.txt; \
	$(GO) -C bench run ./plot -in $(abspath $(BENCH_OUT))/raw.txt -out $(abspath $(BENCH_OUT)); \
	echo "raw results, benchstat summaries (benchstat.txt, benchstat-by-lib.txt), ratios.md and charts in $(BENCH_OUT)/"

chaos: redis
	@set -o pipefail; $(GO) -C chaos test -count=1 -timeout 10m -run 'TestScenario' -v . -chaos.full -chaos.report=$(abspath $(CHAOS_REPORT)) \
	  | grep -v '^redis: '

# sim: SIM_SEEDS seeds of the simulation (no redis-server needed), a progress
# line every 10 s, per-scenario verdicts and hazards per fault kind at the end;
# a failing seed prints its replay command.
SIM_SEEDS ?= 100000
sim:
	$(GO) -C chaos test -count=1 -timeout 0 -run 'TestSim$$' -v ./sim -seeds $(SIM_SEEDS) -progress

# slow: everything make test leaves out for time, in one command. Each step
# is also runnable alone (the command it prints).
SLOW_IDEM_SEEDS ?= 40000
SLOW_FENCE_SEEDS ?= 9000
slow: redis
	$(MAKE) --no-print-directory chaos
	$(GO) -C chaos test -count=1 -timeout 20m -v . -run 'TestBoundsTable' -chaos.full
	$(GO) test -race -count=1 -timeout 20m -run 'TenThousand|Starved' ./renew/ -renew.full
	$(GO) test -race -count=1 -timeout 20m -run 'TestStormOfRetriesChargesEachPaymentOnce$$' ./idempotency/ -storm.payments 1000
	$(GO) -C cmd test -race -count=1 -timeout 20m -run 'TestNothingLeftWithoutATTL$$' ./redlease/ -nottl.locks 10000
	$(MAKE) --no-print-directory sim
	$(GO) -C chaos test -count=1 -timeout 0 -run 'TestSim$$' ./sim -rotation idem -seeds $(SLOW_IDEM_SEEDS)
	$(GO) -C chaos test -count=1 -timeout 0 -run 'TestSim$$' ./sim -rotation fence -seeds $(SLOW_FENCE_SEEDS)
