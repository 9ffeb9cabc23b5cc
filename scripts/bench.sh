#!/usr/bin/env bash
# bench.sh LANE...: everything `make bench` does (and, with
# BENCH_PLAN=sweep, `make bench-sweep`: guest/plans/sweep.plan, results named
# bench-sweep-LANE.*).  For each lane: build the
# kernel and the guest programs, boot a guest sized for the benchmarks
# (GUEST_MEM_MB, no hugetlb reservation, PAGE_TABLE_CHECK off) with
# guest/plans/bench.plan, then
# turn the samples in its console into build/results/bench-LANE.csv, a
# table with ratios to each benchmark's baseline, and SVG plots in
# build/results/plots/.  A benchmark program that fails its own
# correctness checks is reported in build/results/bench-LANE.tap.
. "$(dirname "$0")/lib.sh"
[ $# -gt 0 ] || set -- x86_64
results=$BUILD/results
mkdir -p "$results"
EXTRA_PKGS="gnuplot-nox" "$TOP/scripts/deps.sh"
rc=0
for lane in "$@"; do
	load_lane "$lane"
	step "bench $lane"
	obj=$("$TOP/scripts/build-kernel.sh" "$lane")
	guest=$("$TOP/scripts/build-guest.sh" "$lane" "$obj")
	plan=$TOP/guest/plans/${BENCH_PLAN:-bench}.plan
	name=bench-$lane plots=$results/plots
	if [ "${BENCH_PLAN:-bench}" != bench ]; then
		name=bench-${BENCH_PLAN}-$lane
		plots=$results/plots-${BENCH_PLAN}
	fi
	[ -f "$plan" ] || die "no plan $plan"
	initrd=$guest/${BENCH_PLAN:-bench}.cpio
	"$TOP/scripts/initramfs.sh" "$guest" "$plan" "$initrd"
	console=$results/$name.console
	tmo=$(awk '!/^[[:space:]]*(#|$)/ { t += $3 } END { print t + 180 }' "$plan")
	# The lanes enforce PAGE_TABLE_CHECK for the tests; the benchmarks boot
	# with it off, as production kernels run (with it, every PTE change pays
	# a page_ext lookup and counter updates: a PTE-writing round is 2-5x
	# slower under TCG, measured side by side in docs/results/bench-ptc/).
	GUEST_MEM_MB=${BENCH_MEM_MB:-6144} GUEST_HUGEPAGES=${BENCH_HUGEPAGES:-8} \
		GUEST_CMDLINE_EXTRA=${BENCH_CMDLINE:-page_table_check=0} \
		"$TOP/scripts/boot.sh" "$lane" "$obj" "$initrd" "$console" "$tmo"
	"$TOP/scripts/collect.py" "$lane" "$console" "$plan" "$results/$name.tap" || rc=1
	grep '^not ok' "$results/$name.tap" | sed 's/^/  /' >&2 || true
	"$TOP/scripts/bench-report.py" "$lane" "$console" "$results/$name.csv" \
		"$plots" | tee "$results/$name.txt" || rc=1
done
exit $rc
