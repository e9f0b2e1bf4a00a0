# redlease: the commands a fresh machine needs.
#   make test   vet + every test with -race, against real redis-server processes
#   make demo   the settlement demo: exactly-once settlements on 5 in-process quorum nodes + SQLite
#   make bench  go test -bench, ours and the peers side by side, with -benchmem
#   make chaos  every fault scenario against real processes; table + HTML/SVG report in $(CHAOS_REPORT)

SHELL := /bin/bash
GO    ?= go
COUNT ?= 6
BENCH ?= .
BENCH_OUT ?= .bench
CHAOS_REPORT ?= $(CURDIR)/.chaos-report

.PHONY: test demo bench chaos redis

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

test: redis
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

demo:
	$(GO) run ./examples/settlement

bench: redis
	@mkdir -p $(BENCH_OUT)
	@set -o pipefail; $(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count $(COUNT) ./single/ ./quorum/ ./renew/ ./failover/ | tee $(BENCH_OUT)/raw.txt
	@echo "raw results in $(BENCH_OUT)/raw.txt"

chaos: redis
	@set -o pipefail; $(GO) test -count=1 -timeout 10m -run 'TestScenario' -v ./chaos/ -chaos.full -chaos.report=$(CHAOS_REPORT) \
	  | grep -v '^redis: '
