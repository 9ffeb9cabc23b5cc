#!/usr/bin/env bash
# lane.sh check LANE            build, boot and test one lane; results in
#                               build/results/LANE.{tap,console}
# lane.sh run LANE PROG [ARGS]  boot LANE with PROG (a static binary) as the
#                               only test; exit with PROG's status
#                               (RUN_EXTRA: more static binaries for /bin)
# lane.sh demo LANE [ARGS]      boot LANE and run `uffdwp demo ARGS`: its output on
#                               screen, the kernel console in
#                               build/results/LANE-demo-uffdwp.console
# lane.sh clients LANE          the clients step (docs/clients.md): Debian's
#                               QEMU packed in (scripts/pack-qemu.sh), the
#                               lane's CLIENTS_PLAN (default clients) run
#                               (CLIENTS_REPS: repetitions instead of 3);
#                               build/results/LANE-clients.{tap,console,csv,txt}
. "$(dirname "$0")/lib.sh"
mode=$1 lane=$2
shift 2
load_lane "$lane"
results=$BUILD/results
mkdir -p "$results"
# A run that stops before its TAP is written must not leave the last one's
# in place (check-repeat counts what it finds there).
case $mode in
check) rm -f "$results/$lane.tap" ;;
clients) rm -f "$results/$lane-clients.tap" ;;
esac

obj=$("$TOP/scripts/build-kernel.sh" "$lane")
if [ "$mode" = run ]; then
	# Only PID 1: a half-written test elsewhere must not stop `make run`.
	guest=$("$TOP/scripts/build-guest.sh" "$lane" "$obj" init)
elif [ "$mode" = clients ]; then
	# PID 1 and the clients' test programs only, in a guest directory of
	# their own (the initramfs carries QEMU, not every suite).
	built=$("$TOP/scripts/build-guest.sh" "$lane" "$obj" init bin/qemu-snapshot)
	guest=$BUILD/clients/$lane-guest
	rm -rf "$guest"
	mkdir -p "$guest/bin"
	cp "$built/init" "$guest/"
	cp "$built/bin/qemu-snapshot" "$guest/bin/"
else
	guest=$("$TOP/scripts/build-guest.sh" "$lane" "$obj")
fi

plan_timeout() {
	awk '!/^[[:space:]]*(#|$)/ { t += $3 } END { print t + 0 }' "$1"
}

name=$lane
tree=
if [ "$mode" = clients ]; then
	name=$lane-clients
	PLAN=${CLIENTS_PLAN:-clients}
	PLAN_ONLY=
	PLAN_ARGS=
	tree=$BUILD/clients/$lane-root
	"$TOP/scripts/pack-qemu.sh" "$lane" "$tree"
fi

case $mode in
check | clients)
	# PLAN names one or more plans (guest/plans/NAME.plan), run in order;
	# TIMEOUT_SCALE stretches every entry's timeout for slow kernels;
	# PLAN_ONLY (an extended regex) keeps only the entries whose name
	# matches it (the debug lane's subset in make check); PLAN_ARGS
	# ("NAME=ARG ...") appends ARG to entry NAME's command (a smaller
	# size where a slow kernel would spend minutes on a fill).
	plan=$guest/$mode.plan
	for p in $PLAN; do
		[ -f "$TOP/guest/plans/$p.plan" ] || die "lane $lane: no plan guest/plans/$p.plan"
		cat "$TOP/guest/plans/$p.plan"
	done | awk -v k="${TIMEOUT_SCALE:-1}" -v only="${PLAN_ONLY:-}" -v args="${PLAN_ARGS:-}" \
		'BEGIN { n = split(args, a, " ")
			 for (i = 1; i <= n; i++) {
				 j = index(a[i], "=")
				 if (j < 2) { print "PLAN_ARGS: \"" a[i] "\" is not NAME=ARG" > "/dev/stderr"; bad = 1; exit 1 }
				 extra[substr(a[i], 1, j - 1)] = substr(a[i], j + 1) } }
		 /^[[:space:]]*(#|$)/ { print; next }
		 { seen[$1] = 1 }
		 only != "" && $1 !~ only { next }
		 { $3 = int($3 * k); if ($1 in extra) $0 = $0 " " extra[$1]; print }
		 END { if (bad) exit 1; for (e in extra) if (!(e in seen)) { print "PLAN_ARGS names " e ", not in the plan" > "/dev/stderr"; exit 1 } }' >"$plan" ||
		die "lane $lane: the plan could not be made from PLAN=$PLAN PLAN_ONLY='${PLAN_ONLY:-}' PLAN_ARGS='${PLAN_ARGS:-}' (above)"
	# CLIENTS_REPS: the clients step's repetitions (make check runs one).
	[ "$mode" != clients ] || [ -z "${CLIENTS_REPS:-}" ] ||
		sed -i "s/--reps [0-9]*/--reps $CLIENTS_REPS/" "$plan"
	grep -qv '^[[:space:]]*\(#\|$\)' "$plan" || die "lane $lane: PLAN_ONLY '${PLAN_ONLY:-}' leaves no entry of $PLAN"
	initrd=$guest/$mode.cpio
	INITRAMFS_TREE=$tree "$TOP/scripts/initramfs.sh" "$guest" "$plan" "$initrd"
	console=$results/$name.console
	# The guest is killed at the plan's total timeout, capped by the
	# lane's MAX_GUEST_S (default 40 min): every entry has its own timeout
	# in the guest, so only a hung kernel reaches the cap, and then its
	# unfinished entries fail instead of holding make check for hours.
	tmo=$(($(plan_timeout "$plan") + ${BOOT_MARGIN_S:-120}))
	[ "$tmo" -le "${MAX_GUEST_S:-2400}" ] || tmo=${MAX_GUEST_S:-2400}
	# A guest clock that ran ahead of the host's wall time by more than
	# JUMP_S means the host's TSC, which QEMU's TCG hands to the guest,
	# moved under QEMU (the machine was migrated or paused): every
	# timeout and the RCU stall detector in the guest fire at once, and
	# the run says nothing about the kernel.  Such a run is kept as
	# LANE.clock-jump.console and the lane boots once more; a second
	# jump stands as the result.
	jump=
	for try in 1 2; do
		start=$(date +%s)
		"$TOP/scripts/boot.sh" "$lane" "$obj" "$initrd" "$console" "$tmo"
		ahead=$(guest_clock_ahead "$console" $(($(date +%s) - start)))
		[ "$try" = 1 ] && [ "$ahead" -gt "${JUMP_S:-300}" ] || break
		jump="the guest clock jumped ${ahead}s ahead of the host's in the first boot (console kept as $lane.clock-jump.console): the lane was booted again"
		step "lane $lane: $jump"
		mv "$console" "$results/$name.clock-jump.console"
	done
	rc=0
	skips=$TOP/lanes/$SKIPS.skips
	[ "$mode" = check ] || skips=$TOP/lanes/$name.skips
	[ -f "$skips" ] || skips=
	"$TOP/scripts/collect.py" "$lane" "$console" "$plan" "$results/$name.tap" $skips || rc=$?
	[ -z "$jump" ] || echo "# $jump" >>"$results/$name.tap"
	if [ "$mode" = clients ] && grep -q '^@@O qemu-snapshot,' "$console"; then
		# The figures: medians and spreads in LANE-clients.csv, the
		# table (ratios to stop-and-copy) in LANE-clients.txt.
		"$TOP/scripts/bench-report.py" "$lane" "$console" "$results/$name.csv" \
			"$results/plots-clients" >"$results/$name.txt" 2>&1 || true
		sed -n '/qemu-snapshot/p' "$results/$name.txt" | sed 's/^/  /' >&2
	fi
	grep '^not ok' "$results/$name.tap" | sed 's/^/  /' >&2 || true
	echo "lane $name: $(tap_totals "$results/$name.tap" || true)" >&2
	exit $rc
	;;
run | demo)
	if [ "$mode" = demo ]; then
		# libuffdwp's demo: a snapshot of a busy arena, verified record
		# by record against the snapshot instant.
		prog=$guest/bin/uffdwp
		set -- demo "$@"
	else
		prog=${1:?usage: lane.sh run LANE PROG [ARGS...]}
		shift
		[ -f "$prog" ] || die "PROG $prog does not exist"
		file -L "$prog" 2>/dev/null | grep -q 'statically linked' ||
			step "warning: $prog does not look statically linked; the guest has no libc"
	fi
	name=$(basename "$prog")
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	echo "run/$name exit ${RUN_TIMEOUT_S:-600} /bin/$name $*" >"$tmp/plan"
	mkdir -p "$tmp/guest/bin"
	cp "$guest/init" "$tmp/guest/init"
	initrd=$tmp/run.cpio
	# shellcheck disable=SC2086 # RUN_EXTRA is a list of paths
	"$TOP/scripts/initramfs.sh" "$tmp/guest" "$tmp/plan" "$initrd" "$prog" ${RUN_EXTRA:-}
	console=$results/$lane-$mode-$name.console
	# The demo shows only its own output; the kernel's goes to CONSOLE.
	show=1
	if [ "$mode" = demo ]; then
		show=2
		step "demo: the kernel console goes to ${console#"$TOP"/}"
	fi
	"$TOP/scripts/boot.sh" "$lane" "$obj" "$initrd" "$console" \
		"$((${RUN_TIMEOUT_S:-600} + ${BOOT_MARGIN_S:-120}))" "$show"
	end=$(grep -a "^@@END run/$name " "$console" | tail -1 || true)
	if ! "$TOP/scripts/collect.py" --splats "$console" >"$tmp/splats"; then
		step "warning: kernel reports in the console ($console):"
		head -n 5 "$tmp/splats" | sed 's/^/  /' >&2
	fi
	case $end in
	*" exit="*) code=${end#* exit=}; code=${code%% *}
		step "$name exited with status $code"; exit "$code" ;;
	"") step "$name did not finish (see $console)"; exit 125 ;;
	*) step "$name: ${end#* run/"$name" }"; exit 125 ;;
	esac
	;;
*) die "usage: lane.sh check|clients|run|demo LANE ..." ;;
esac
