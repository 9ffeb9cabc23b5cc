#!/usr/bin/env bash
# build-each-patch.sh [LANE...]: build every prefix of the series, one patch
# at a time, with each lane's configuration (default: x86_64 riscv64), so
# that a patch that only builds with a later one shows up.  Incremental, in
# a build slot of its own per lane ($CACHE/slot/LANE-each), so each step
# recompiles what that patch changed.  Results as TAP in
# build/results/each-patch.tap (names build-each/LANE/NN-subject).
# EACH_FROM=N starts at patch N (its prefix is built whole first), for a
# series whose earlier prefixes were already built with these lanes.
. "$(dirname "$0")/lib.sh"
[ $# -gt 0 ] || set -- x86_64 riscv64
results=$BUILD/results
mkdir -p "$results"
tap=$results/each-patch.tap
"$TOP/scripts/deps.sh"
export CCACHE_DIR=${CCACHE_DIR:-$CACHE/ccache} CCACHE_BASEDIR=$CACHE
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G} CCACHE_NOHASHDIR=1
lines=()
fail=0
for lane in "$@"; do
	load_lane "$lane"
	tree=$("$TOP/scripts/tree.sh" "$TOP/$SERIES")
	mapfile -t commits < <(git -C "$tree" rev-list --reverse base..HEAD)
	slot=$CACHE/slot/$lane-each
	exec 9>"$CACHE/slot/.lock-$lane-each"
	flock 9
	kmake=(make -C "$slot/src" O="$slot/obj" ARCH="$KARCH" CROSS_COMPILE="$CROSS_COMPILE"
	       CC="ccache ${CROSS_COMPILE}gcc" HOSTCC="ccache gcc" -s)
	frags=()
	for f in $FRAGMENTS; do frags+=("$TOP/kernel/configs/$f.config"); done
	n=0
	for c in "${commits[@]}"; do
		n=$((n + 1))
		[ "$n" -ge "${EACH_FROM:-1}" ] || continue
		subject=$(git -C "$tree" log -1 --format=%s "$c" | tr -c 'A-Za-z0-9.:_+-' '-' | cut -c1-60)
		name=build-each/$lane/$(printf %02d "$n")-$subject
		slot_checkout "$slot" "$tree" "$c"
		log=$slot/patch-$(printf %02d "$n").log
		start=$(date +%s)
		# Options a later patch adds are simply not there yet: no check
		# that every fragment option survived, unlike build-kernel.sh.
		if { "${kmake[@]}" "$BASE_CONFIG" &&
		     KCONFIG_CONFIG="$slot/obj/.config" "$slot/src/scripts/kconfig/merge_config.sh" \
			-m -O "$slot/obj" "$slot/obj/.config" "${frags[@]}" &&
		     "${kmake[@]}" olddefconfig &&
		     "${kmake[@]}" -j"$(($(nproc) + 1))"; } >"$log" 2>&1; then
			lines+=("ok|$name # $(($(date +%s) - start))s")
		else
			lines+=("not ok|$name # build failed, log $log")
			grep -E 'error|Error' "$log" | head -5 >&2 || true
			fail=1
		fi
		step "${lines[-1]/|/ }"
	done
	exec 9>&-
done
{
	echo "TAP version 13"
	echo "1..${#lines[@]}"
	i=0
	for l in "${lines[@]}"; do
		i=$((i + 1))
		echo "${l%%|*} $i ${l#*|}"
	done
} >"$tap"
awk '/^ok / { p++ } /^not ok/ { f++ } END { printf "each patch: %d built, %d failed\n", p, f }' "$tap"
exit $fail
