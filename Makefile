# uffd-wp: userfaultfd write-protection, built on Debian's linux-source-6.12,
# tested in QEMU.  `make help` lists the targets.

LANES ?= x86_64 riscv64 x86_64-debug
# Every lane that carries the series: make check-all (docs/lanes.md: why
# arm64 and ppc64le are not in the default set).
ALL_LANES ?= x86_64 riscv64 x86_64-debug arm64 ppc64le ppc64le-64k ppc64le-64k-hash
# The clients step (docs/clients.md): Debian's QEMU in these lanes' guests;
# make clients runs CLIENT_LANES, make check-all ALL_CLIENT_LANES.  Not in
# make check (CHECK_CLIENT_LANES is empty): one repetition with the fault
# cases took 3.6-4.0 min of x86_64 guest time (4.1-5.0 min in all), above its
# 3-minute budget.
CLIENT_LANES ?= x86_64
ALL_CLIENT_LANES ?= x86_64 arm64 ppc64le
CHECK_CLIENT_LANES ?=
LANE  ?= $(firstword $(LANES))
PROG  ?=
ARGS  ?=

.PHONY: all check check-all clients check-repeat check-fresh deb demo bench bench-sweep soak run prog mutation-check build-each-patch kernel kernel-tree export-patches help clean

all: check

## check: install what is missing, check the series, build/boot/test LANES
check:
	@CLIENT_LANES="$(CHECK_CLIENT_LANES)" CLIENTS_REPS=1 scripts/check.sh $(LANES)

## check-all: make check on ALL_LANES (adds arm64, ppc64le and ppc64le-64k,
##       three more kernels, and the ppc64le-64k-hash boot of the last;
##       the debug lane runs its full plan, not make check's reliability
##       subset; docs/lanes.md)
check-all:
	@DEBUG_FULL=1 CLIENT_LANES="$(ALL_CLIENT_LANES)" scripts/check.sh $(ALL_LANES)

## clients: the clients step alone in CLIENT_LANES (QEMU's background
##       snapshot of a nested VM against stop-and-copy and savevm, 3 times;
##       build/results/LANE-clients.{tap,csv,txt}; docs/clients.md)
clients:
	@scripts/deps.sh $(CLIENT_LANES)
	@rc=0; for l in $(CLIENT_LANES); do scripts/lane.sh clients $$l || rc=1; done; exit $$rc

## check-repeat: run LANES' check plans N times (default 5) in fresh boots and
##       report per test how many runs failed (build/results/repeat/)
N ?= 5
check-repeat:
	@scripts/check-repeat.sh $(N) $(LANES)

## check-fresh: `make demo` (or T_FRESH=target) on a new minimal Debian 12 root
##       built with mmdebstrap, with an empty cache; slow, run it when the
##       dependencies change (result in build/fresh/result.txt)
T_FRESH ?= demo
check-fresh:
	@scripts/check-fresh.sh $(T_FRESH)

## deb: libuffdwp0, libuffdwp-dev and uffdwp .deb packages in build/deb/
##       (dpkg-buildpackage, lintian, examples built against them)
deb:
	@scripts/deb.sh

## demo: boot the patched kernel and run `uffdwp demo`: fork and libuffdwp
##       snapshot a busy arena side by side (pause, extra memory, worst
##       write), then pre-copy and a session's delta, each verified record by
##       record; the kernel console goes to build/results/LANE-demo-uffdwp.console
demo:
	@scripts/deps.sh
	@scripts/lane.sh demo $(LANE)

## bench: run the benchmarks in BENCH_LANES (default x86_64); CSV, table
##        and plots in build/results/bench-LANE.{csv,txt} and plots/
BENCH_LANES ?= x86_64
bench:
	@scripts/bench.sh $(BENCH_LANES)

## bench-sweep: cost curves (guest/plans/sweep.plan: dirty-harvest against
##        the size tracked, snapshot against the arena, write-tracking
##        against the writers) with fitted slopes; about 10 min;
##        build/results/bench-sweep-LANE.{csv,txt}, plots-sweep/
bench-sweep:
	@BENCH_PLAN=sweep scripts/bench.sh $(BENCH_LANES)

## soak: the fuzzer in LANE's guest for DURATION seconds (default 600),
##       SEED to replay a run
DURATION ?= 600
SEED ?=
soak:
	@scripts/deps.sh
	@scripts/soak.sh $(LANE) $(DURATION) $(SEED)

## run: boot LANE with PROG (static binary) as the only test, ARGS for it
run:
	@test -n "$(PROG)" || { echo "usage: make run LANE=x86_64 PROG=path/to/static-binary [ARGS=...]"; exit 2; }
	@scripts/deps.sh
	@scripts/lane.sh run $(LANE) $(abspath $(PROG)) $(ARGS)

## prog: build one guest program of LANE, e.g. make prog T=conformance-api
prog:
	@test -n "$(T)" || { echo "usage: make prog [LANE=x86_64] T=name-of-tests/name.c-without-.c"; exit 2; }
	@scripts/build-guest.sh $(LANE) "$$(scripts/build-kernel.sh $(LANE))" bin/$(T)
	@echo build/guest/$(LANE)/bin/$(T)

## mutation-check: the suites on a kernel without uffd-wp must fail
mutation-check:
	@scripts/mutation-check.sh

## build-each-patch: build every prefix of the series for EACH_LANES (one patch
##       at a time, incrementally; EACH_FROM=N starts at patch N); TAP in
##       build/results/each-patch.tap
EACH_LANES ?= x86_64 riscv64
build-each-patch:
	@scripts/build-each-patch.sh $(EACH_LANES)

## kernel: build LANE's kernel only and print its object directory
kernel:
	@scripts/deps.sh
	@scripts/build-kernel.sh $(LANE)

## kernel-tree: a git checkout of the patched tree in build/linux to edit
kernel-tree:
	@scripts/deps.sh
	@scripts/kernel-tree.sh

## export-patches: regenerate the topics' patches (kernel/topics/*/) from build/linux
##       (TOPIC_COUNTS="13 5 24 4 7" after adding or removing a commit)
export-patches:
	@scripts/export-patches.sh

## help: this list
help:
	@sed -n 's/^## //p' Makefile

## clean: remove build/ (the kernel cache outside the clone stays)
clean:
	@! grep -q " $(abspath build)/" /proc/mounts || { echo "error: mounts under build/ (a make check-fresh root?): umount them first:"; grep " $(abspath build)/" /proc/mounts | cut -d" " -f2; exit 1; }
	rm -rf build

## lib: build/host/libuffdwp.{a,so} and the uffdwp tool for this machine
## install: install libuffdwp (headers, libs, uffdwp.pc, tool) under PREFIX
## check-host: libuffdwp's unit tests on this machine's kernel
include lib/lib.mk
