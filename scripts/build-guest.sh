#!/usr/bin/env bash
# build-guest.sh LANE OBJ [TARGET...]: static guest binaries for LANE into
# build/guest/LANE, against the uAPI headers of the lane's kernel (OBJ) and
# its tree's selftests.  TARGETs are names under build/guest/LANE (default:
# everything).
. "$(dirname "$0")/lib.sh"
load_lane "$1"
obj=$2
tree=$(readlink -f "$obj/source")
out=$BUILD/guest/$LANE
shift 2
targets=()
for t in "$@"; do targets+=("$out/$t"); done
command -v "$GUEST_CC" >/dev/null || die "lane $LANE needs $GUEST_CC (run scripts/deps.sh)"
# One make per output directory: make check builds a later lane's
# programs in the background while an earlier lane runs.
mkdir -p "$out"
exec 9>"$out/.lock"
wait_lock 9 "guest $LANE"
step "guest $LANE: building static binaries"
make -s -C "$TOP" -f guest/guest.mk -j"$(nproc)" OUT="$out" CC="$GUEST_CC" AR="${GUEST_CC%gcc}ar" \
	UAPI="$obj/uapi" KSRC="$tree" ${targets[@]+"${targets[@]}"} >&2
echo "$out"
