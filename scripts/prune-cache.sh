#!/usr/bin/env bash
# prune-cache.sh: keep the kernel cache bounded.  Object directories and
# series worktrees are keyed by content, so old keys pile up as the series
# changes; keep the most recently used ones (KEEP_OBJS, KEEP_TREES) and
# delete the rest.  The base trees, the per-lane build slots (one each,
# reused by every build of the lane) and ccache (size-capped) are kept.
. "$(dirname "$0")/lib.sh"
keep_objs=${KEEP_OBJS:-10}
keep_trees=${KEEP_TREES:-4}

prune() {	# DIR KEEP
	[ -d "$1" ] || return 0
	find "$1" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' | sort -rn |
		tail -n +"$(($2 + 1))" | cut -d' ' -f2- | while read -r d; do
		step "cache: removing old $d"
		rm -rf "$d"
	done
}
prune "$CACHE/obj" "$keep_objs"
prune "$CACHE/trees" "$keep_trees"
for b in "$CACHE"/base/*/; do
	[ -d "$b/.git" ] && git -C "$b" worktree prune
done
exit 0
