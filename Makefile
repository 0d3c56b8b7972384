# minipy: `make test` is what CI runs (through .ci/run); `make bench` prints our numbers
# beside the anchors' (shared/bench/anchors.py) in one run.
GO ?= go
PYTHON ?= /usr/bin/python3
ANCHORS ?= ../shared/bench/anchors.py
export CGO_ENABLED := 1

# Every module in the tree: the core one and the examples/commands that carry SDKs.
MODULES := $(sort $(patsubst %/go.mod,%,$(shell find . -name go.mod -not -path './.git/*')))

.PHONY: test test-no-tracefs test-oldest vet bench bench-once build soak deps compat compat-ft fuzz

# Installs python3-dev, pkg-config, python3-numpy with apt when missing (as root).
deps:
	@.ci/deps

# (The timeouts only catch a hang: on a machine loaded 4x its cores, the core module's tests
# under -race take 4-5 times their 5 minutes, past the 20 minutes they once had.)
test: deps vet
	@set -e; for m in $(MODULES); do echo "== go test -race $$m"; (cd $$m && $(GO) test -race -count=1 -timeout 60m ./...); done
	@echo "== soak: 100,000 runs without -race (RSS is only meaningful there)"
	$(GO) test -run '^TestSoak$$' -count=1 -timeout 30m .
	@$(MAKE) --no-print-directory fuzz FUZZTIME=20000x
	@$(MAKE) --no-print-directory bench-once
	@$(MAKE) --no-print-directory test-no-tracefs

# What needs tracefs, again in a mount namespace of its own without it, as on a fresh
# machine (.ci/deps mounts one on this machine; a session once did by hand, and CI stayed
# green while every new clone failed): internal/opcount's tests and the counting benchmark.
# Needs root, as the counts do.
test-no-tracefs:
	@echo "== without tracefs (unshare -m): internal/opcount, BenchmarkCounts"
	@[ "$$(id -u)" = 0 ] || { echo "test-no-tracefs needs root (unshare -m; the counts need it too)"; exit 1; }
	unshare -m bash -ec 'for d in /sys/kernel/tracing /sys/kernel/debug/tracing /sys/kernel/debug; do \
	    if mountpoint -q $$d; then umount -l $$d; fi; done; test ! -e /sys/kernel/tracing/events; \
	  $(GO) test -count=1 ./internal/opcount; \
	  out=$$($(GO) test -run "^$$" -bench "^BenchmarkCounts$$" -benchtime 1x -count 1 . 2>&1) || { echo "$$out"; exit 1; }; \
	  echo "$$out"; if grep -q "counting less" <<<"$$out"; then echo "BenchmarkCounts counted less without tracefs"; exit 1; fi'

# Each module built, vetted and its test binaries linked with the oldest Go its go.mod's go
# line allows (go 1.24 is the toolchain go1.24.0), which the go command fetches through the
# module proxy: what a go line promises is that the module compiles with that Go. (Running
# every test again took CI 10 of its 45 minutes, which 3.14 and 3.15 need now; -run
# '^$' still links every test binary.) CI runs it after `make test`.
test-oldest:
	@set -e; for m in $(MODULES); do \
	  v=$$(awk '$$1 == "go" {print $$2}' $$m/go.mod); case $$v in *.*.*) ;; *) v=$$v.0 ;; esac; \
	  echo "== GOTOOLCHAIN=go$$v go vet, go test -run '^$$' $$m"; \
	  (cd $$m && GOTOOLCHAIN=go$$v $(GO) vet ./... && GOTOOLCHAIN=go$$v $(GO) test -count=1 -run '^$$' ./... >/dev/null); done

# The fuzz targets (fuzz_test.go), each for FUZZTIME; `make test` gives them 20,000 inputs
# each (a few seconds): a count, not a duration, because Go before 1.27 can fail a timed run
# with a bare "context deadline exceeded" when the time is up (go.dev/issue/75804).
# A crash is saved under testdata/fuzz/<target>: fix it and keep the file as a seed.
FUZZ_TARGETS := FuzzToolArguments FuzzValueCodec FuzzWorkerFrames
FUZZTIME ?= 2m
fuzz:
	@set -e; for f in $(FUZZ_TARGETS); do echo "== fuzz $$f ($(FUZZTIME))"; \
	  $(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) .; done

vet:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done

build:
	$(GO) build -o bin/minipy ./cmd/minipy

# Every benchmark of every module once (-benchtime 1x, about a minute and a half), so
# that none can rot unnoticed; `make test` runs it.
bench-once:
	@set -e; for m in $(MODULES); do echo "== benchmarks once: $$m"; \
	  (cd $$m && $(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./...); done

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 .
	@if [ -f $(ANCHORS) ]; then echo "== anchors ($(ANCHORS), $(PYTHON))"; $(PYTHON) $(ANCHORS) || echo "(anchors need python3-ipython python3-ipykernel python3-jupyter-client)"; fi

# The 100k-run memory soak (about a minute), then the chaos test at the size of issue 39's
# trials (20 sessions of 150 calls over HTTP, a random process of the server killed every
# 300 ms; a few minutes).
soak:
	$(GO) test -run TestSoak -count=1 -v -timeout 30m .
	cd cmd/minipy-mcp && $(GO) test -run '^TestChaos$$' -chaos-long -count=1 -v -timeout 30m .

# The core module's tests against other CPython builds (scripts/compat says how): 3.13
# built from Debian's source package (reused once built), a pyenv 3.12 when this machine
# has one, and Debian sid's 3.14 and 3.15 (binary packages in a prefix of their own, with
# sid's glibc). CI runs it after `make test`, without -race (make test has it), two
# targets at a time (scripts/compat-all, COMPAT_JOBS).
compat:
	scripts/compat-all 3.13 3.12 3.14 3.15

# The same against a free-threaded 3.13 (--disable-gil), with -race; not in CI.
compat-ft:
	scripts/compat 3.13t test -race
