#!/usr/bin/env bash
# soak.sh LANE SECONDS [SEED]: run the userfaultfd fuzzer in LANE's guest for
# SECONDS (instead of the fixed operation count of `make check`) and fail on
# any invariant failure or kernel report.  The seed is printed so a failure
# can be replayed with the same SEED.  SOAK_PROG=ring-stress runs the write-log
# ring's differential stress test (tests/ring-stress.c) instead of the fuzzer.
. "$(dirname "$0")/lib.sh"
lane=${1:?usage: soak.sh LANE SECONDS [SEED]} secs=${2:?usage: soak.sh LANE SECONDS [SEED]}
seed=${3:-$(date +%s)}
[[ $secs =~ ^[0-9]+$ ]] && [ "$secs" -gt 0 ] || die "SECONDS must be a positive number, got '$secs'"
[[ $seed =~ ^[0-9]+$ ]] || die "SEED must be a number, got '$seed'"
load_lane "$lane"
obj=$("$TOP/scripts/build-kernel.sh" "$lane")
prog=${SOAK_PROG:-fuzz-uffd}
case $prog in
fuzz-uffd) summary='# fuzz:' margin=120 ;;
ring-stress) summary='# ring-stress:' margin=300 ;;
*) die "SOAK_PROG must be fuzz-uffd or ring-stress, got '$prog'" ;;
esac
guest=$("$TOP/scripts/build-guest.sh" "$lane" "$obj" "bin/$prog")
step "soak $lane: $prog for ${secs}s, seed $seed"
rc=0
RUN_TIMEOUT_S=$((secs + margin)) "$TOP/scripts/lane.sh" run "$lane" "$guest/bin/$prog" \
	--seed "$seed" --seconds "$secs" || rc=$?
console=$BUILD/results/$lane-run-$prog.console
if ! "$TOP/scripts/collect.py" --splats "$console" >"$console.splats"; then
	step "soak $lane: kernel reports in $console:"
	head -n 5 "$console.splats" | sed 's/^/  /' >&2
	rc=1
fi
grep -a "$summary" "$console" | tail -1 | sed 's/^@@O //' >&2 || true
exit $rc
