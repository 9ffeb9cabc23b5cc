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

# A command that fails under `set -e` says which script, line and command
# failed, so no step ends in a bare "Error 2" from make.  die() exits on its
# own and is not reported twice.
on_err() {
	local rc=$1 line=$2 cmd=$3
	printf 'error: %s:%s: `%s` failed (exit %s)\n' \
		"${0#"$TOP"/}" "$line" "$cmd" "$rc" >&2
}
set -o errtrace
trap 'on_err $? $LINENO "$BASH_COMMAND"' ERR

# logged LOG WHAT CMD...: run CMD with its output appended to LOG; when it
# fails, print WHAT failed, the last lines of LOG and LOG's path, and exit.
logged() {
	local log=$1 what=$2 rc=0
	shift 2
	"$@" >>"$log" 2>&1 || rc=$?
	[ $rc -eq 0 ] && return 0
	printf 'error: %s failed (exit %s); last lines of %s:\n' "$what" "$rc" "$log" >&2
	tail -n "${LOG_TAIL:-30}" "$log" | sed 's/^/  | /' >&2
	printf 'error: %s failed; full log: %s\n' "$what" "$log" >&2
	exit 1
}

# need_cmd CMD PACKAGE: die naming CMD and the Debian package that brings it
# when CMD is not on PATH.
need_cmd() {
	command -v "$1" >/dev/null 2>&1 ||
		die "$1 not found on PATH (Debian package $2; scripts/deps.sh installs it)"
}

# check_fragments CONFIG FRAGMENT...: every option a fragment sets (or
# unsets) has that value in CONFIG; print each one that does not and return
# 1.  Options named in ALLOW_MISSING are not checked (a lane built to show
# what Kconfig refuses, e.g. riscv64-base).
check_fragments() {
	local config=$1 line want opt bad=0
	shift
	while IFS= read -r line; do
		case "$line" in
		CONFIG_*=*) want=$line ;;
		"# CONFIG_"*" is not set") want=$line ;;
		*) continue ;;
		esac
		opt=${want#\# }; opt=${opt%%[= ]*}
		[[ " ${ALLOW_MISSING:-} " == *" $opt "* ]] && continue
		if [[ $want == *"is not set" ]]; then
			grep -q "^$opt=" "$config" &&
				{ echo "  $opt: wanted off, got $(grep "^$opt=" "$config")" >&2; bad=1; }
		else
			grep -qx "$want" "$config" ||
				{ echo "  $opt: wanted ${want#*=}, got $(grep -E "^$opt=|^# $opt is" "$config" || echo unset)" >&2; bad=1; }
		fi
	done < <(cat "$@")
	return $bad
}

# write_tap OUT RESULT...: write RESULTs ("ok NAME # note" or "not ok NAME #
# why") as a TAP file, numbered; status 1 when one is "not ok".
write_tap() {
	local out=$1 i=0 r
	shift
	{
		echo "TAP version 13"
		echo "1..$#"
		for r in "$@"; do
			i=$((i + 1))
			case $r in
			"not ok "*) echo "not ok $i ${r#not ok }" ;;
			*) echo "ok $i ${r#ok }" ;;
			esac
		done
	} >"$out"
	! grep -q '^not ok' "$out"
}

# tap_totals TAP...: the line "N passed, N failed, N skipped" over the
# files (an "ok ... # SKIP" is a skip); status 1 when something failed.
tap_totals() {
	awk '/^ok .*# SKIP/ { s++; next } /^ok / { p++ } /^not ok/ { f++ }
		END { printf "%d passed, %d failed, %d skipped\n", p, f, s; exit f > 0 }' "$@"
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

# The patch files named by a series file, in order, as absolute paths.  A
# line naming a file called "series" (a path relative to this one, e.g.
# topics/1-fixes/series) includes that topic's series in its place; any
# other line names a patch in the patches/ folder beside the series file.
series_patches() {
	local series=$1 dir p
	dir=$(dirname "$series")
	[ -f "$series" ] || return 0
	sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$series" | while read -r p; do
		[ -n "$p" ] || continue
		if [ "$(basename "$p")" = series ]; then
			[ -f "$dir/$p" ] || die "series $series includes $p, which does not exist"
			series_patches "$dir/$p"
			continue
		fi
		[ -f "$dir/patches/$p" ] || die "series $series names $p, which is not in $dir/patches"
		echo "$dir/patches/$p"
	done
}

# The topic folders a series file includes, in order (absolute paths).
series_topics() {
	local series=$1 dir
	dir=$(dirname "$series")
	sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$series" | while read -r p; do
		[ "$(basename "${p:-x}")" = series ] || continue
		(cd "$dir/$(dirname "$p")" && pwd)
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
	SKIPS=
	# shellcheck source=/dev/null
	. "$conf"
	# lanes/$SKIPS.skips: the skips the lane expects (collect.py).
	SKIPS=${SKIPS:-$LANE}
	: "${ARCH:?lane must set ARCH}" "${KARCH:?}" "${BASE_CONFIG:?}" "${FRAGMENTS:?}"
	: "${QEMU:?}" "${KERNEL_IMAGE:?}" "${SERIES:=kernel/series}" "${QEMU_PKG:=$QEMU}"
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

# wait_lock FD WHAT: flock FD, saying so every minute while another
# process holds it (make check's background job building the same lane).
# While make check waits on that job (UFFDWP_BG_PID), the job gets the
# CPU at normal priority, and its nice 19 back once the lock is ours.
wait_lock() {
	local fd=$1 what=$2 bg=/proc/${UFFDWP_BG_PID:-none}/autogroup
	flock -n "$fd" && return 0
	step "$what: waiting for the build under way beside it (build/results/background.log)"
	[ ! -w "$bg" ] || echo 0 2>/dev/null >"$bg" || true
	until flock -w 60 "$fd"; do
		step "$what: still waiting"
	done
	[ ! -w "$bg" ] || echo 19 2>/dev/null >"$bg" || true
}

# guest_clock_ahead CONSOLE HOST_S: by how many seconds the last kernel
# timestamp in CONSOLE exceeds HOST_S, the host's wall time for the boot
# (0 if it does not).
guest_clock_ahead() {
	awk -v host="$2" 'match($0, /^\[ *[0-9]+\.[0-9]+\]/) {
		t = substr($0, RSTART + 1, RLENGTH - 2) + 0; if (t > max) max = t }
		END { d = int(max - host); print (d > 0 ? d : 0) }' "$1"
}
