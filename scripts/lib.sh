# Shared helpers for the pipeline scripts.  Source it; do not run it.
# shellcheck shell=bash
set -euo pipefail

TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-$TOP/build}
CACHE=${UFFDWP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/uffdwp}
TREE_PKG=linux-source-6.12
TREE_TARBALL=/usr/src/linux-source-6.12.tar.xz
SCRIPT_START=${SCRIPT_START:-$(date +%s)}

# step MESSAGE: a progress line with the time since the script started.
step() {
	printf '[%4ds] %s\n' "$(($(date +%s) - SCRIPT_START))" "$*" >&2
}

die() {
	printf 'error: %s\n' "$*" >&2
	exit 1
}

# Short content hash of stdin.
key_of() {
	sha256sum | cut -c1-12
}

tree_version() {
	dpkg-query -W -f='${Version}' "$TREE_PKG" 2>/dev/null ||
		die "$TREE_PKG is not installed (run scripts/deps.sh)"
}

# The tree version as it appears in cache paths (no '~' or other oddities).
tree_key() {
	tree_version | tr -c 'A-Za-z0-9.+-' '_'
}

# The patch files named by a series file, in order, as absolute paths.
series_patches() {
	local series=$1 dir
	dir=$(dirname "$series")/patches
	[ -f "$series" ] || return 0
	sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$series" | while read -r p; do
		[ -n "$p" ] || continue
		[ -f "$dir/$p" ] || die "series $series names $p, which is not in $dir"
		echo "$dir/$p"
	done
}

# Key of a series: its list and the content of every patch it names.
series_key() {
	local series=$1
	{
		echo "series-format-1"
		series_patches "$series" | while read -r p; do
			basename "$p"
			cat "$p"
		done
	} | key_of
}

# load_lane NAME: read lanes/NAME.conf into the environment.
load_lane() {
	LANE=$1
	local conf=$TOP/lanes/$LANE.conf
	[ -f "$conf" ] || die "no lane '$LANE' (known: $(cd "$TOP/lanes" && ls ./*.conf | sed 's|./||; s|\.conf$||' | tr '\n' ' '))"
	# shellcheck source=/dev/null
	. "$conf"
	: "${ARCH:?lane must set ARCH}" "${KARCH:?}" "${BASE_CONFIG:?}" "${FRAGMENTS:?}"
	: "${QEMU:?}" "${KERNEL_IMAGE:?}" "${SERIES:=kernel/series}"
	CROSS_COMPILE=${CROSS_COMPILE:-}
	GUEST_CC=${GUEST_CC:-${CROSS_COMPILE}gcc}
}

# slot_checkout SLOT TREE COMMIT: make SLOT/src a worktree of TREE's base
# repository at COMMIT (the keyed trees are worktrees of it too, so their
# commits are at hand), creating it on first use.  Moving an existing slot
# rewrites only the files that differ, so make recompiles only those.
slot_checkout() {
	local slot=$1 tree=$2 commit=$3 base_repo
	base_repo=$(git -C "$tree" rev-parse --path-format=absolute --git-common-dir)
	base_repo=${base_repo%/.git}
	if [ ! -e "$slot/src/.git" ]; then
		rm -rf "$slot"
		mkdir -p "$slot"
		git -C "$base_repo" worktree prune
		git -C "$base_repo" worktree add -q --detach "$slot/src" "$commit"
	else
		git -C "$slot/src" checkout -q -f --detach "$commit"
		git -C "$slot/src" clean -q -fdx
	fi
	mkdir -p "$slot/obj"
}
