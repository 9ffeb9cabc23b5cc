#!/usr/bin/env bash
# mutation-check.sh [LANE]: run the suites on a lane whose kernel lacks
# uffd-wp (default x86_64-nowp) and require that the write-protect cases
# fail there, rather than pass or skip.  Prints which passed anyway.
. "$(dirname "$0")/lib.sh"
lane=${1:-x86_64-nowp}
"$TOP/scripts/deps.sh"
"$TOP/scripts/lane.sh" check "$lane" || true
tap=$BUILD/results/$lane.tap
[ -s "$tap" ] || die "no results for $lane"
failed=$(grep -c '^not ok' "$tap" || true)
skipped=$(grep -c '# SKIP' "$tap" || true)
echo "mutation lane $lane: $failed not ok, $skipped skipped, of $(grep -c '^\(not \)\?ok' "$tap")"
echo "cases that still pass without uffd-wp (they check no write-protection):"
grep -E '^ok .*(conformance|demo)/' "$tap" | sed 's/^/  /'
[ "$failed" -gt 0 ] || die "the suites passed on a kernel without uffd-wp"
[ "$skipped" -eq 0 ] || die "cases skipped instead of failing"
