#!/usr/bin/env bash
# boot.sh LANE OBJ INITRAMFS CONSOLE_LOG TIMEOUT_S [VERBOSE]
# Boot the lane's kernel with the initramfs under QEMU (TCG), two NUMA nodes
# and reserved huge pages; write the serial console to CONSOLE_LOG.  A guest
# still running after TIMEOUT_S seconds is killed: a hung guest fails its
# lane, it never hangs make.  Progress lines name each plan entry as it runs;
# with VERBOSE=1 the whole console is shown instead; with VERBOSE=2 only what
# the entries print (make demo: no kernel messages, the console stays in
# CONSOLE_LOG).
. "$(dirname "$0")/lib.sh"
load_lane "$1"
obj=$2 initrd=$3 log=$4 tmo=$5 verbose=${6:-0}
need_cmd "$QEMU" "$QEMU_PKG"
mem=${GUEST_MEM_MB:-2048}
half=$((mem / 2))
hugepages=${GUEST_HUGEPAGES:-160}
# GUEST_CMDLINE_EXTRA: more for this boot only (make bench: page_table_check=0).
cmdline="console=$QEMU_CONSOLE panic=-1 hugepagesz=2M hugepages=$hugepages ${CMDLINE_EXTRA:-} ${GUEST_CMDLINE_EXTRA:-}"

# shellcheck disable=SC2086
qemu=("$QEMU" $QEMU_MACHINE -smp 2,sockets=2,cores=1,threads=1 -m "${mem}M"
	-object memory-backend-ram,id=m0,size=${half}M
	-object memory-backend-ram,id=m1,size=$((mem - half))M
	-numa node,nodeid=0,cpus=0,memdev=m0
	-numa node,nodeid=1,cpus=1,memdev=m1
	-kernel "$obj/$KERNEL_IMAGE" -initrd "$initrd" -append "$cmdline"
	-nodefaults -display none -serial stdio -monitor none -no-reboot)

step "boot $LANE: QEMU (timeout ${tmo}s)"
start=$(date +%s)
set +e
timeout --kill-after=5 "$tmo" "${qemu[@]}" </dev/null 2>&1 | tee "$log" | {
	if [ "$verbose" = 1 ]; then
		sed -u -e '/^@@O /s/^@@O //' -e '/^@@BEGIN /d;/^@@END /d;/^@@DONE/d;/^@@BOOT/d'
	elif [ "$verbose" = 2 ]; then
		while IFS= read -r line; do
			line=${line%$'\r'}
			case "$line" in
			@@BOOT*) step "boot $LANE: guest up (${line#@@BOOT })" ;;
			@@O\ *) printf '%s\n' "${line#@@O }" ;;
			@@O) echo ;;
			esac
		done
	else
		while IFS= read -r line; do
			case "$line" in
			@@BOOT*) step "boot $LANE: guest up (${line#@@BOOT })" ;;
			@@BEGIN*) set -- $line; step "  $2 ..." ;;
			@@END*) set -- $line; step "  $2: $3 (${4#ms=} ms)" ;;
			@@WARN*) step "  guest: ${line#@@WARN }" ;;
			esac
		done
	fi
}
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
	step "boot $LANE: guest killed after ${tmo}s; last console lines:"
	tail -15 "$log" | sed 's/^/    /' >&2
elif [ "$rc" -ne 0 ]; then
	step "boot $LANE: QEMU exited with $rc; last console lines:"
	tail -15 "$log" | sed 's/^/    /' >&2
else
	step "boot $LANE: guest powered off after $(($(date +%s) - start))s"
fi
exit 0
