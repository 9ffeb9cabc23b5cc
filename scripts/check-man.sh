#!/usr/bin/env bash
# check-man.sh TAP_OUT: the manual pages.  Every page lints clean with
# mandoc -T lint (warnings count), every alias page (.so) points to a page
# that exists, and every function uffdwp.h declares has a section 3 page.
. "$(dirname "$0")/lib.sh"
out=$1
need_cmd mandoc mandoc
results=()
pages=()
for p in "$TOP"/man/*.[137]; do
	grep -q '^\.so ' "$p" || pages+=("$p")
done
for p in "${pages[@]}"; do
	name=$(basename "$p")
	report=$(mandoc -T lint -W warning "$p" 2>&1 || true)
	[ -z "$report" ] && results+=("ok man/lint-$name") ||
		results+=("not ok man/lint-$name # $(head -n 1 <<<"$report")")
done
bad=
for p in "$TOP"/man/*.[137]; do
	target=$(sed -n 's/^\.so man[0-9]\/\(.*\)$/\1/p' "$p")
	[ -z "$target" ] || [ -f "$TOP/man/$target" ] || bad="$bad $(basename "$p")->$target"
done
[ -z "$bad" ] && results+=("ok man/aliases-resolve") ||
	results+=("not ok man/aliases-resolve # dangling:$bad")
missing=
fns=$(grep -oE '^[a-z_ ]+[*]*[[:space:]]*[*]*uffdwp_[a-z_]+[(]' "$TOP/include/uffdwp.h" |
	grep -oE 'uffdwp_[a-z_]+[(]$' | tr -d '(')
[ -n "$fns" ] || missing=" (no function found in uffdwp.h)"
for fn in $fns; do
	[ -f "$TOP/man/$fn.3" ] || missing="$missing $fn"
done
[ -z "$missing" ] && results+=("ok man/every-function-has-a-page") ||
	results+=("not ok man/every-function-has-a-page # no page for:$missing")
write_tap "$out" "${results[@]}"
