#!/usr/bin/env bash
# check-topics.sh TAP_OUT: the series' topics are separate postings.
#   series/topic-NAME-applies-on-DEPS: each topic applies to the base tree
#     with only the topics its "depends" file names applied first;
#   series/fix-N-applies-alone: each fix of the fixes topic (a line of its
#     "groups" file: the fix and its selftest) applies alone to the base
#     tree, as a stable backport would;
#   series/proposal-NAME-applies: each patch kept ready in kernel/proposals
#     applies on top of the whole series.
# Patches are applied with `git apply --cached` to a scratch index read
# from the base commit (no files are written), removed at the end.
. "$(dirname "$0")/lib.sh"
out=$1
series=$TOP/kernel/series
base=$("$TOP/scripts/tree.sh" /dev/null)
index=$(mktemp "${TMPDIR:-/tmp}/uffdwp-topics-index.XXXXXX")
trap 'rm -f "$index"' EXIT
results=()

# apply_on_base PATCH...: reset the scratch index to base and apply the
# patches in order; print the first that does not apply.
apply_on_base() {
	GIT_INDEX_FILE=$index git -C "$base" read-tree base
	local p
	for p in "$@"; do
		if ! GIT_INDEX_FILE=$index git -C "$base" apply --cached "$p" 2>/dev/null; then
			basename "$p"
			return 1
		fi
	done
}

topic_patches() {
	series_patches "$TOP/kernel/topics/$1/series"
}

mapfile -t topics < <(series_topics "$series")
for t in "${topics[@]}"; do
	name=$(basename "$t")
	deps=$(sed -e 's/#.*//' "$t/depends" 2>/dev/null | xargs || true)
	patches=()
	for d in $deps; do
		[ -d "$TOP/kernel/topics/$d" ] || die "topic $name depends on $d, which is not a topic"
		mapfile -t -O "${#patches[@]}" patches < <(topic_patches "$d")
	done
	mapfile -t -O "${#patches[@]}" patches < <(topic_patches "$name")
	label=$(echo "${deps:-base}" | tr ' ' '+')
	if bad=$(apply_on_base "${patches[@]}"); then
		results+=("ok series/topic-$name-applies-on-$label # $(topic_patches "$name" | wc -l) patch(es)")
	else
		results+=("not ok series/topic-$name-applies-on-$label # $bad does not apply")
	fi
done

fixes=$TOP/kernel/topics/1-fixes
if [ -f "$fixes/groups" ]; then
	mapfile -t fixpatches < <(topic_patches 1-fixes)
	n=0
	while read -r line; do
		line=${line%%#*}
		[ -n "${line// /}" ] || continue
		n=$((n + 1))
		group=()
		for i in $line; do
			[ "$i" -ge 1 ] && [ "$i" -le ${#fixpatches[@]} ] ||
				die "$fixes/groups names patch $i; the topic has ${#fixpatches[@]}"
			group+=("${fixpatches[$((i - 1))]}")
		done
		if bad=$(apply_on_base "${group[@]}"); then
			results+=("ok series/fix-$n-applies-alone # patch(es) $line of 1-fixes")
		else
			results+=("not ok series/fix-$n-applies-alone # $bad does not apply to the base tree alone")
		fi
	done <"$fixes/groups"
fi
mapfile -t all < <(series_patches "$series")
for p in "$TOP"/kernel/proposals/*.patch; do
	[ -f "$p" ] || continue
	name=$(basename "$p" .patch)
	if bad=$(apply_on_base "${all[@]}" "$p"); then
		results+=("ok series/proposal-$name-applies # on the whole series")
	else
		results+=("not ok series/proposal-$name-applies # $bad does not apply")
	fi
done
write_tap "$out" "${results[@]}"
