#!/usr/bin/env bash
# mutation-check.sh [LANE]: run the suites on a lane whose kernel lacks
# uffd-wp (default x86_64-nowp) and require that the write-protect cases
# fail there, rather than pass or skip.  Prints which passed anyway.
#
# The only skips allowed are the ones the lane declares in lanes/$SKIPS.skips
# (collect.py already turns any other skip into "not ok"): the library's
# "feature missing" paths for a feature this kernel has, which check no
# write-protection.  Each must also be in that list here, by name.
#
# MUTATION_TAP=FILE also writes the verdict as TAP (mutation/LANE-*);
# MUTATION_CACHED_ONLY=1 runs only when the lane's kernel is built already
# and otherwise writes a skip saying so (make check's mutation step).
. "$(dirname "$0")/lib.sh"
lane=${1:-x86_64-nowp}
tapout=${MUTATION_TAP:-}
verdict() {	# verdict OK NUMBER NAME DETAIL
	[ -n "$tapout" ] || return 0
	printf '%s %d mutation/%s-%s # %s\n' "$([ "$1" = 1 ] && echo ok || echo 'not ok')" \
		"$2" "$lane" "$3" "$4" >>"$tapout"
}
if [ -n "$tapout" ]; then
	printf 'TAP version 13\n1..2\n' >"$tapout"
fi
"$TOP/scripts/deps.sh"
if [ -n "${MUTATION_CACHED_ONLY:-}" ] &&
   ! KERNEL_CACHED_ONLY=1 "$TOP/scripts/build-kernel.sh" "$lane" >/dev/null; then
	if [ -n "$tapout" ]; then
		printf 'TAP version 13\n1..1\nok 1 mutation/%s # SKIP its kernel is not built here (make mutation-check builds it)\n' \
			"$lane" >"$tapout"
	fi
	exit 0
fi
"$TOP/scripts/lane.sh" check "$lane" || true
tap=$BUILD/results/$lane.tap
if [ ! -s "$tap" ]; then
	verdict 0 1 suites-fail "no results"
	verdict 0 2 no-undeclared-skip "no results"
	die "no results for $lane"
fi
load_lane "$lane"
declared=$TOP/lanes/$SKIPS.skips
failed=$(grep -c '^not ok' "$tap" || true)
skips=$(grep '# SKIP' "$tap" | sed -E 's/^ok [0-9]+ ([^ ]+) .*/\1/' || true)
undeclared=$(for s in $skips; do
	grep -qE "^$s( |\$)" "$declared" 2>/dev/null || echo "$s"
done)
echo "mutation lane $lane: $failed not ok, $(echo "$skips" | grep -c . || true) skipped, of $(grep -c '^\(not \)\?ok' "$tap")"
echo "skips declared in ${declared#"$TOP"/} (no write-protection in them):"
grep '# SKIP' "$tap" | sed 's/^/  /'
echo "cases that still pass without uffd-wp (they check no write-protection):"
grep -E '^ok .*(conformance|demo)/' "$tap" | sed 's/^/  /'
verdict "$([ "$failed" -gt 0 ] && echo 1 || echo 0)" 1 suites-fail \
	"$failed not ok of $(grep -c '^\(not \)\?ok' "$tap") without uffd-wp"
verdict "$([ -z "$undeclared" ] && echo 1 || echo 0)" 2 no-undeclared-skip \
	"undeclared skips: ${undeclared:-none}"
[ "$failed" -gt 0 ] || die "the suites passed on a kernel without uffd-wp"
[ -z "$undeclared" ] || die "cases skipped instead of failing: $undeclared"
