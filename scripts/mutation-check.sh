#!/usr/bin/env bash
# mutation-check.sh [LANE]: run the suites on a lane whose kernel lacks
# uffd-wp (default x86_64-nowp) and require that the write-protect cases
# fail there, rather than pass or skip.  Prints which passed anyway.
#
# The only skips allowed are the ones the lane declares in lanes/$SKIPS.skips
# (collect.py already turns any other skip into "not ok"): the library's
# "feature missing" paths for a feature this kernel has, which check no
# write-protection.  Each must also be in that list here, by name.
. "$(dirname "$0")/lib.sh"
lane=${1:-x86_64-nowp}
"$TOP/scripts/deps.sh"
"$TOP/scripts/lane.sh" check "$lane" || true
tap=$BUILD/results/$lane.tap
[ -s "$tap" ] || die "no results for $lane"
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
[ "$failed" -gt 0 ] || die "the suites passed on a kernel without uffd-wp"
[ -z "$undeclared" ] || die "cases skipped instead of failing: $undeclared"
