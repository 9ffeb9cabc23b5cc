#!/usr/bin/env bash
# check-repeat.sh N LANE...: run each lane's check plan N times, each in a
# fresh boot, and report per test how many runs failed.  The kernels and
# guest binaries are built once (the first run); every run keeps its TAP and
# console in build/results/repeat/LANE-RUN.{tap,console}.  The summary, one
# line per test that failed at least once and a total per lane, goes to
# stdout and to build/results/repeat/summary.txt.  Exit 0 when no run of any
# lane failed a test.
#
# FROM=k resumes: runs 1..k-1 are kept from an earlier invocation (their
# TAP files must be in build/results/repeat/, e.g. copied back from
# docs/results/repeat/), only runs k..N boot, and the summary covers all N.
. "$(dirname "$0")/lib.sh"
n=${1:?usage: check-repeat.sh N LANE...}
shift
from=${FROM:-1}
[[ $from =~ ^[1-9][0-9]*$ ]] || die "FROM must be a positive number, not '$from'"
[ $# -gt 0 ] || set -- x86_64 riscv64 x86_64-debug
[[ $n =~ ^[1-9][0-9]*$ ]] || die "N must be a positive number, not '$n'"
dir=$BUILD/results/repeat
mkdir -p "$dir"
if [ "$from" = 1 ]; then
	rm -f "$dir"/*.tap "$dir"/*.console "$dir/summary.txt"
else
	for lane in "$@"; do
		for i in $(seq 1 $((from - 1))); do
			[ -f "$dir/$lane-$i.tap" ] ||
				die "FROM=$from: $dir/$lane-$i.tap is missing (copy the earlier runs there)"
		done
	done
fi
"$TOP/scripts/deps.sh" "$@"
for lane in "$@"; do
	load_lane "$lane" >/dev/null
	for i in $(seq "$from" "$n"); do
		step "lane $lane: run $i of $n"
		"$TOP/scripts/lane.sh" check "$lane" || true
		cp "$BUILD/results/$lane.tap" "$dir/$lane-$i.tap" 2>/dev/null ||
			printf 'TAP version 13\n1..1\nnot ok 1 kernel/build # lane did not get to boot\n' >"$dir/$lane-$i.tap"
		cp "$BUILD/results/$lane.console" "$dir/$lane-$i.console" 2>/dev/null || true
	done
done
# Per lane: tests that failed in some run, "failed F of N runs", then a
# total line.  A test missing from a run of this invocation (FROM..N)
# counts as failed in it; one missing from an earlier run only is listed
# as "ran in R of N runs" (the plan grew in between).
for lane in "$@"; do
	awk -v lane="$lane" -v n="$n" -v from="$from" '
		FNR == 1 {
			run = FILENAME
			sub(/.*-/, "", run)
			sub(/\.tap$/, "", run)
			run += 0
		}
		/^(not )?ok / {
			name = $0
			sub(/^(not )?ok [0-9]+ /, "", name)
			sub(/ #.*/, "", name)
			seen[name]++
			if (run >= from) seen_now[name]++
			if (/^not ok/) failed[name]++
			else if (/# SKIP/) skipped[name]++
		}
		END {
			bad = 0
			for (t in seen) {
				f = failed[t] + (n - from + 1 - seen_now[t])
				if (f) { printf "%s %s: failed %d of %d runs\n", lane, t, f, n; bad++ }
				else if (skipped[t]) printf "%s %s: skipped %d of %d runs\n", lane, t, skipped[t], n
				if (!f && seen[t] < n) printf "%s %s: ran in %d of %d runs\n", lane, t, seen[t], n
			}
			printf "%s: %d runs, %d tests, %d with a failure\n", lane, n, length(seen), bad
		}' "$dir/$lane"-*.tap
done | tee "$dir/summary.txt"
! grep -q 'failed [1-9]' "$dir/summary.txt"
