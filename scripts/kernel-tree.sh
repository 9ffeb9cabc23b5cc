#!/usr/bin/env bash
# kernel-tree.sh: give developers a git checkout of the patched tree in
# build/linux.  Its commit tagged "base" is the Debian tree; each commit on
# top is one patch of kernel/series.  Edit, commit, then `make
# export-patches`.  An existing checkout is left alone.
. "$(dirname "$0")/lib.sh"
dst=$BUILD/linux
if [ -d "$dst/.git" ]; then
	n=$(git -C "$dst" rev-list --count base..HEAD)
	step "build/linux exists: $n commit(s) on top of base; left as it is"
	exit 0
fi
base=$("$TOP/scripts/tree.sh" /dev/null)
step "cloning the base tree into build/linux"
mkdir -p "$BUILD"
git clone -q --local "$base" "$dst"
git -C "$dst" fetch -q origin tag base
git -C "$dst" checkout -q -b series base
while read -r p; do
	git -C "$dst" am -q "$p" || die "patch $(basename "$p") does not apply; build/linux is mid-am"
done < <(series_patches "$TOP/kernel/series")
step "build/linux: $(git -C "$dst" rev-list --count base..HEAD) patch(es) applied on branch 'series'"
