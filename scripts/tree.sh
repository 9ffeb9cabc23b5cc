#!/usr/bin/env bash
# tree.sh [SERIES]: print the path of a clean kernel tree with SERIES applied.
#
# The Debian tarball is unpacked once per package version into a git
# repository whose first commit is tagged "base".  Each series gets its own
# worktree, keyed by the content of its patches, so a tree never changes once
# made and object directories built from it stay valid.  An empty series uses
# the base checkout itself.
. "$(dirname "$0")/lib.sh"

series=${1:-$TOP/kernel/series}
[ -f "$series" ] || series=$TOP/$series
ver=$(tree_version)
base=$CACHE/base/$(tree_key)

# Trees are made once; concurrent callers wait for the one making them.
mkdir -p "$CACHE"
exec 8>"$CACHE/.tree.lock"
flock 8

# No automatic gc: the base repository starts with the whole tree as
# loose objects, and the first `git am` would pack them and prune 80,000
# files (on a new machine that held the first kernel build for 6 min,
# 2026-12-07); nothing here needs them packed.
git_q() { git -c user.name=uffdwp -c user.email=uffdwp@localhost -c gc.auto=0 "$@"; }

if [ ! -f "$base/.uffdwp-base" ]; then
	step "unpacking $TREE_TARBALL ($TREE_PKG $ver) into $base"
	rm -rf "$base" "$base.tmp"
	mkdir -p "$base.tmp"
	tar -C "$base.tmp" -xf "$TREE_TARBALL"
	mv "$base.tmp"/linux-source-* "$base"
	rmdir "$base.tmp"
	# Debian's .gitignore hides every top-level path (its packaging repo
	# tracks only debian/); drop that block so the tree can be tracked.
	sed -i '/^# Debian packaging/,$d' "$base/.gitignore"
	sed -i '${/^#$/d}' "$base/.gitignore"
	step "recording the base tree in git"
	git_q -C "$base" init -q
	git -C "$base" config gc.auto 0
	git_q -C "$base" add -A
	git_q -C "$base" commit -q -m "$TREE_PKG $ver as unpacked from $TREE_TARBALL"
	git_q -C "$base" tag base
	touch "$base/.uffdwp-base"
	step "base tree ready"
fi

mapfile -t patches < <(series_patches "$series")
if [ ${#patches[@]} -eq 0 ]; then
	echo "$base"
	exit 0
fi

key=$(series_key "$series")
tree=$CACHE/trees/$(tree_key)-$key
if [ ! -f "$tree/.uffdwp-tree" ]; then
	step "applying ${#patches[@]} patch(es) from ${series#"$TOP"/} to a new worktree"
	rm -rf "$tree"
	git -C "$base" worktree prune
	mkdir -p "$CACHE/trees"
	git_q -C "$base" worktree add -q --detach "$tree" base
	for p in "${patches[@]}"; do
		if ! git_q -C "$tree" am -q "$p" >&2; then
			git -C "$tree" am --abort || true
			die "patch $(basename "$p") does not apply to $TREE_PKG $ver"
		fi
	done
	touch "$tree/.uffdwp-tree"
	step "series applied: $tree"
fi
echo "$tree"
