#!/usr/bin/env bash
# check-series.sh TAP_OUT: the series applies in order to the Debian tree, and
# scripts/checkpatch.pl --strict (signoff checked) from that tree finds no
# error in any patch.
. "$(dirname "$0")/lib.sh"
out=$1
series=$TOP/kernel/series
results=()
if tree=$("$TOP/scripts/tree.sh" "$series"); then
	results+=("ok series/apply # $(series_patches "$series" | wc -l) patch(es) on $TREE_PKG $(tree_version)")
else
	results+=("not ok series/apply # the series does not apply (see above)")
	tree=$CACHE/base/$(tree_key)
fi
while read -r p; do
	[ -n "$p" ] || continue
	name=$(basename "$p" .patch)
	report=$(cd "$tree" && perl scripts/checkpatch.pl --strict --terse "$p" 2>&1 || true)
	errors=$(grep -c ': ERROR:' <<<"$report" || true)
	if [ "$errors" -eq 0 ]; then
		results+=("ok series/checkpatch-$name # $(grep -c ': \(WARNING\|CHECK\):' <<<"$report" || true) warning(s)/check(s)")
	else
		results+=("not ok series/checkpatch-$name # $errors error(s): $(grep ': ERROR:' <<<"$report" | head -1)")
	fi
done < <(series_patches "$series")
write_tap "$out" "${results[@]}"
