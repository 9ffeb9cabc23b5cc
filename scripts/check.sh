#!/usr/bin/env bash
# check.sh LANE...: everything `make check` does.  Installs what is missing,
# checks the series, then builds, boots and tests each lane in turn (a lane
# that fails does not stop the others) and ends with the line
#   N passed, N failed, N skipped
# counted over build/results/{pipeline,abi,man,deb,series}.tap, each
# lane's TAP and mutation.tap.
. "$(dirname "$0")/lib.sh"
[ $# -gt 0 ] || set -- x86_64 riscv64 x86_64-debug
results=$BUILD/results
mkdir -p "$results"

# The checks that need no guest.
checks() {
	step "pipeline: failing steps speak"
	"$TOP/scripts/test-pipeline.sh" "$results/pipeline.tap" || true
	step "libuffdwp: ABI and manual pages"
	"$TOP/scripts/check-abi.sh" "$results/abi.tap" || true
	"$TOP/scripts/check-man.sh" "$results/man.tap" || true
	step "libuffdwp: Debian packages"
	"$TOP/scripts/deb.sh" "$results/deb.tap" >/dev/null || true
	step "series: apply and checkpatch"
	"$TOP/scripts/check-series.sh" "$results/series.tap" || true
	step "series: each topic on its dependencies, each fix alone"
	"$TOP/scripts/check-topics.sh" "$results/topics.tap" || true
}
taps=("$results/pipeline.tap" "$results/abi.tap" "$results/man.tap" "$results/deb.tap"
      "$results/series.tap" "$results/topics.tap")

# Beside the lanes, at the lowest priority: the later lanes' kernels and
# guest programs, then the checks above.  A lane's guest leaves the cores
# partly idle (a single-threaded test uses one of the two vCPUs, a test
# that waits uses none); nice 19 gives that idle time to the compilers and
# keeps the cores with the guest, whose tests measure time, whenever it
# wants them.  On a new machine this takes the later kernels off the
# critical path as far as the guests leave room (docs/lanes.md#times);
# with the kernels cached it is the checks' few minutes.  A lane whose
# kernel is still being built here waits for it (build-kernel.sh and
# build-guest.sh lock per lane).  BACKGROUND=0 runs it all in line.
bglog=$results/background.log
background() {
	local lane obj
	shift
	for lane in "$@"; do
		obj=$("$TOP/scripts/build-kernel.sh" "$lane") &&
			"$TOP/scripts/build-guest.sh" "$lane" "$obj" >/dev/null || true
	done
	checks
}
# check.sh --background LANE...: that job.  setsid made it the leader of
# a process group of its own (the compilers too), which goes when make
# check does, however it ends.
if [ "${1:-}" = --background ]; then
	parent=$2
	shift 2
	# A session of its own is a scheduling group of its own (autogroup),
	# which the scheduler shares the CPU with as an equal whatever the
	# nice value of its processes: give the group itself nice 19 too.
	echo 19 2>/dev/null >/proc/self/autogroup || true
	(while kill -0 "$parent" 2>/dev/null; do sleep 5; done
	 kill -- -$$ 2>/dev/null) &
	watchdog=$!
	background "$@"
	kill "$watchdog" 2>/dev/null || true
	exit 0
fi

# Everything installed up front, the Debian packages' tools too: apt must
# not run in the background beside the lanes.
EXTRA_PKGS="build-essential debhelper dpkg-dev lintian pkgconf" "$TOP/scripts/deps.sh" "$@"
rm -f "${taps[@]}"
bgpid=
if [ "${BACKGROUND:-1}" != 0 ]; then
	step "background: the later lanes' kernels and programs, then the checks without a guest (log: ${bglog#"$TOP"/})"
	setsid nice -n 19 ionice -c 3 bash "$0" --background $$ "$@" >"$bglog" 2>&1 &
	bgpid=$!
	export UFFDWP_BG_PID=$bgpid
	trap '[ -z "$bgpid" ] || kill -- -"$bgpid" 2>/dev/null || true' EXIT
else
	checks
fi
for lane in "$@"; do
	load_lane "$lane" >/dev/null
	rm -f "$results/$lane.tap" "$results/$lane.console" "$results/$lane.clock-jump.console"
	step "lane $lane"
	if ! "$TOP/scripts/lane.sh" check "$lane" && [ ! -s "$results/$lane.tap" ]; then
		printf 'TAP version 13\n1..1\nnot ok 1 kernel/build # lane %s did not get to boot (see above)\n' \
			"$lane" >"$results/$lane.tap"
	fi
	taps+=("$results/$lane.tap")
done
# The clients step (docs/clients.md): Debian's QEMU and its background
# snapshot in the guests of CLIENT_LANES that are among the lanes checked
# (make check-all: x86_64 and arm64, three repetitions; make check: none by
# default, CHECK_CLIENT_LANES=x86_64 for one repetition).
for lane in ${CLIENT_LANES:-}; do
	[[ " $* " == *" $lane "* ]] || continue
	rm -f "$results/$lane-clients".{tap,console,csv,txt}
	step "clients $lane"
	if ! "$TOP/scripts/lane.sh" clients "$lane" && [ ! -s "$results/$lane-clients.tap" ]; then
		printf 'TAP version 13\n1..1\nnot ok 1 clients/run # the clients step of lane %s did not get to boot (see above)\n' \
			"$lane" >"$results/$lane-clients.tap"
	fi
	taps+=("$results/$lane-clients.tap")
done
# The mutation lane (x86_64 without uffd-wp) must fail the suites; run when
# x86_64 is checked and its kernel is built already (make mutation-check
# builds it), so a new machine's first check does not pay for a fourth
# kernel.  MUTATION=0 leaves it out.
if [[ " $* " == *" x86_64 "* ]] && [ "${MUTATION:-1}" != 0 ]; then
	# Its lane fails on purpose: the log, not the screen, gets its "not ok".
	step "mutation lane x86_64-nowp (if its kernel is built; log: ${results#"$TOP"/}/mutation.log)"
	MUTATION_TAP=$results/mutation.tap MUTATION_CACHED_ONLY=1 \
		"$TOP/scripts/mutation-check.sh" x86_64-nowp >"$results/mutation.log" 2>&1 || true
	grep -h '^\(not \)\?ok' "$results/mutation.tap" | sed 's/^/  /'
	taps+=("$results/mutation.tap")
fi
if [ -n "$bgpid" ]; then
	step "background: waiting for it to finish"
	bgrc=0
	wait "$bgpid" || bgrc=$?
	bgpid=
	grep -E '^(error|warning):' "$bglog" >&2 || true
	[ "$bgrc" -eq 0 ] || echo "error: the background job ended with status $bgrc (${bglog#"$TOP"/})" >&2
fi
# A check whose TAP was never written fails (its log says why).
for t in "${taps[@]}"; do
	[ -s "$t" ] || printf 'TAP version 13\n1..1\nnot ok 1 %s/written # no TAP from this step (see the log above or %s)\n' \
		"$(basename "$t" .tap)" "${bglog#"$TOP"/}" >"$t"
done
grep -h '^not ok' "${taps[@]}" | sed 's/^/  /' >&2 || true
tap_totals "${taps[@]}"
