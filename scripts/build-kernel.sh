#!/usr/bin/env bash
# build-kernel.sh LANE: build the lane's kernel (if not built yet) and print
# the object directory.  The object directory is keyed by the tree (version +
# series) and the lane's configuration, so an existing one is complete and
# nothing is rebuilt.
#
# The compile itself happens in a per-lane build slot with fixed paths
# ($CACHE/slot/LANE/{src,obj}): the slot's source is checked out to the keyed
# tree's commit and built incrementally, so a new series key recompiles only
# the files the series changed (a keyed path in every compile command would
# defeat both make and ccache).  The results (image, uAPI headers, config,
# logs) are then copied into the keyed object directory.
. "$(dirname "$0")/lib.sh"
load_lane "$1"
# The lane's own packages (a cross compiler, its QEMU); stdout is the
# object directory, so whatever deps.sh prints goes to stderr.
"$TOP/scripts/deps.sh" "$1" >&2

if [ "$SERIES" = none ]; then
	tree=$("$TOP/scripts/tree.sh" /dev/null)
else
	tree=$("$TOP/scripts/tree.sh" "$TOP/$SERIES")
fi
frags=()
for f in $FRAGMENTS; do
	[ -f "$TOP/kernel/configs/$f.config" ] || die "lane $LANE: no fragment kernel/configs/$f.config"
	frags+=("$TOP/kernel/configs/$f.config")
done
cc="${CROSS_COMPILE}gcc"
command -v "$cc" >/dev/null || die "lane $LANE needs $cc (run scripts/deps.sh)"
confkey=$({
	echo "$ARCH $KARCH $BASE_CONFIG $CROSS_COMPILE"
	"$cc" --version | head -1
	cat "${frags[@]}"
} | key_of)
# KERNEL_LANE (a lane's .conf): boot the kernel another lane builds (same
# tree and fragments) instead of building it again under this lane's name.
klane=${KERNEL_LANE:-$LANE}
obj=$CACHE/obj/$(basename "$tree")-$klane-$confkey
slot=$CACHE/slot/$klane
kmake=(make -C "$slot/src" O="$slot/obj" ARCH="$KARCH" CROSS_COMPILE="$CROSS_COMPILE"
       CC="ccache ${cc}" HOSTCC="ccache gcc" -s)
export CCACHE_DIR=${CCACHE_DIR:-$CACHE/ccache} CCACHE_BASEDIR=$CACHE
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G} CCACHE_NOHASHDIR=1
export KBUILD_BUILD_TIMESTAMP="uffdwp" KBUILD_BUILD_USER=uffdwp KBUILD_BUILD_HOST=uffdwp

# One build per lane at a time (the slot is the lane's); a second caller
# waits for it and then finds the object directory built.
mkdir -p "$CACHE/obj" "$CACHE/slot"
exec 9>"$CACHE/slot/.lock-$klane"
wait_lock 9 "kernel $LANE"

if [ -f "$obj/.uffdwp-built" ]; then
	touch "$obj" "$tree"	# most recently used: kept by prune-cache.sh
	step "kernel $LANE: up to date ($obj)"
	echo "$obj"
	exit 0
fi

# KERNEL_CACHED_ONLY: only say whether it is built (make check's mutation
# step runs only on a kernel built before).
if [ -n "${KERNEL_CACHED_ONLY:-}" ]; then
	step "kernel $LANE: not built yet ($obj)"
	exit 3
fi
rm -rf "$obj"
# The slot's source, moved to this tree's commit.
slot_checkout "$slot" "$tree" "$(git -C "$tree" rev-parse HEAD)"
mkdir -p "$obj"
# A build that failed or was interrupted may leave the slot half made; make
# copes with that, but not with a stale image passing for a new one.
rm -f "$slot/obj/$KERNEL_IMAGE" "$slot/obj/.uffdwp-built"
step "kernel $LANE: configuring ($BASE_CONFIG + $FRAGMENTS)"
: >"$obj/config.log"
logged "$obj/config.log" "kernel $LANE: make $BASE_CONFIG" "${kmake[@]}" "$BASE_CONFIG"
logged "$obj/config.log" "kernel $LANE: merging the fragments ($FRAGMENTS)" \
	env KCONFIG_CONFIG="$slot/obj/.config" "$slot/src/scripts/kconfig/merge_config.sh" -m -O "$slot/obj" \
	"$slot/obj/.config" "${frags[@]}"
logged "$obj/config.log" "kernel $LANE: make olddefconfig" "${kmake[@]}" olddefconfig

# Every option a fragment asks for must survive olddefconfig; a silently
# dropped option (unmet dependency) would make a lane test less than it says.
check_fragments "$slot/obj/.config" "${frags[@]}" ||
	die "lane $LANE: config fragment options were not applied (see above; $obj/config.log)"

step "kernel $LANE: building in $slot for $obj"
# Objects compiled since the build started, for the progress lines.  make
# creates and deletes temporary files while find walks the tree, and find
# then exits 1: a progress count must never stop the build.
count_built() {
	{ find "$slot/obj" -name '*.o' -newer "$obj/.build-start" 2>/dev/null || true; } | wc -l
}
log=$obj/build.log
start=$(date +%s)
touch "$obj/.build-start"
"${kmake[@]}" -j"$(($(nproc) + 1))" >"$log" 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do
	sleep 15
	kill -0 $pid 2>/dev/null || break
	n=$(count_built)
	step "kernel $LANE: building, $n objects (re)compiled so far, $(($(date +%s) - start))s"
done
if ! wait $pid; then
	printf 'error: kernel %s: build failed; last lines of %s:\n' "$LANE" "$log" >&2
	tail -n 40 "$log" | sed 's/^/  | /' >&2
	die "kernel $LANE: build failed (full log: $log)"
fi
n=$(count_built)
rm -f "$obj/.build-start"
[ -f "$slot/obj/$KERNEL_IMAGE" ] || die "kernel $LANE: no $KERNEL_IMAGE after the build"
logged "$log" "kernel $LANE: make headers_install" "${kmake[@]}" headers_install INSTALL_HDR_PATH="$obj/uapi"
# What the rest of the pipeline reads: the image, the uAPI headers, the
# config and symbols, and `source` naming the keyed tree (selftests are
# built from it).
mkdir -p "$obj/$(dirname "$KERNEL_IMAGE")"
cp "$slot/obj/$KERNEL_IMAGE" "$obj/$KERNEL_IMAGE"
cp "$slot/obj/.config" "$slot/obj/System.map" "$obj/"
ln -sfn "$tree" "$obj/source"
touch "$obj/.uffdwp-built"
step "kernel $LANE: built in $(($(date +%s) - start))s ($n objects compiled)"
"$TOP/scripts/prune-cache.sh" >&2 || true
echo "$obj"
