#!/usr/bin/env bash
# export-patches.sh: write the commits of build/linux past "base" to
# kernel/patches (git format-patch) and list them in kernel/series.
. "$(dirname "$0")/lib.sh"
src=$BUILD/linux
[ -d "$src/.git" ] || die "no build/linux: run 'make kernel-tree' first"
if [ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]; then
	git -C "$src" status --short --untracked-files=no >&2
	die "build/linux has uncommitted changes: commit them first"
fi
rm -f "$TOP"/kernel/patches/*.patch
mkdir -p "$TOP/kernel/patches"
git -C "$src" format-patch -q --no-signature -o "$TOP/kernel/patches" base..HEAD
{
	echo "# Applied in order with 'git am' to Debian's $TREE_PKG tree."
	(cd "$TOP/kernel/patches" && ls -- *.patch 2>/dev/null || true)
} >"$TOP/kernel/series"
step "exported $(git -C "$src" rev-list --count base..HEAD) patch(es) to kernel/patches"
