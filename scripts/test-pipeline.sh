#!/usr/bin/env bash
# test-pipeline.sh TAP_OUT: the pipeline's own failure paths speak.  Each
# case provokes a failing step the way a user's machine would (a tool
# missing from PATH, a kernel config fragment Kconfig refuses, a logged
# build step that fails, a command failing under set -e) and checks that
# the message names what failed, shows the log's last lines and its path.
# Nothing here builds or boots a kernel: it takes seconds.
. "$(dirname "$0")/lib.sh"
out=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=()

# expect NAME FILE PATTERN...: every PATTERN (grep -E) occurs in FILE.
expect() {
	local name=$1 file=$2 pat
	shift 2
	for pat in "$@"; do
		if ! grep -qE -- "$pat" "$file"; then
			results+=("not ok pipeline/$name # no '$pat' in: $(head -c 300 "$file" | tr '\n' '|')")
			return
		fi
	done
	results+=("ok pipeline/$name")
}

# A PATH that has every command of the usual directories except $1.
path_without() {
	local hide=$1 dir=$tmp/path-without-$1 d f
	mkdir -p "$dir"
	for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
		[ -d "$d" ] || continue
		for f in "$d"/*; do
			[ -x "$f" ] && [ ! -e "$dir/${f##*/}" ] && [ "${f##*/}" != "$hide" ] &&
				ln -s "$f" "$dir/${f##*/}"
		done
	done
	echo "$dir"
}

# 1. A logged step that fails: what failed, its exit code, the last lines of
#    its log and the log's path; the caller stops with a non-zero status.
log=$tmp/step.log
rc=0
(logged "$log" "demo step" sh -c 'echo first line; echo the-real-cause >&2; exit 3') \
	2>"$tmp/logged.err" || rc=$?
if [ $rc -eq 0 ]; then
	results+=("not ok pipeline/logged-step-speaks # the failing step returned 0")
else
	expect logged-step-speaks "$tmp/logged.err" 'demo step failed \(exit 3\)' \
		'the-real-cause' "full log: $log"
fi

# 2. A command failing under set -e in a pipeline script: the script, the
#    line and the command are named (no bare "Error 2" from make).
cat >"$tmp/fails.sh" <<EOF
#!/usr/bin/env bash
. "$TOP/scripts/lib.sh"
ls /nonexistent-uffdwp-path >/dev/null
echo not reached
EOF
rc=0
bash "$tmp/fails.sh" >"$tmp/fails.out" 2>"$tmp/fails.err" || rc=$?
if [ $rc -eq 0 ] || grep -q 'not reached' "$tmp/fails.out"; then
	results+=("not ok pipeline/failed-command-speaks # the script went on after the failure")
else
	expect failed-command-speaks "$tmp/fails.err" 'fails\.sh:3: `ls /nonexistent-uffdwp-path[^`]*` failed \(exit 2\)'
fi

# 3. A config fragment option Kconfig does not keep (unknown, or with an
#    unmet dependency): the lane stops and names the option.
printf 'CONFIG_USERFAULTFD=y\n# CONFIG_KSM is not set\n' >"$tmp/.config"
printf 'CONFIG_USERFAULTFD=y\nCONFIG_UFFDWP_NO_SUCH_OPTION=y\n' >"$tmp/frag.config"
if check_fragments "$tmp/.config" "$tmp/frag.config" 2>"$tmp/frag.err"; then
	results+=("not ok pipeline/fragment-option-refused # an option missing from .config passed")
else
	expect fragment-option-refused "$tmp/frag.err" 'CONFIG_UFFDWP_NO_SUCH_OPTION: wanted y, got unset'
fi
printf 'CONFIG_USERFAULTFD=y\n' >"$tmp/good.config"
check_fragments "$tmp/.config" "$tmp/good.config" 2>/dev/null &&
	results+=("ok pipeline/fragment-option-kept") ||
	results+=("not ok pipeline/fragment-option-kept # an option present in .config was refused")

# 4. QEMU missing from PATH: booting a lane says which program and which
#    package, before anything else happens.
p=$(path_without qemu-system-x86_64)
rc=0
PATH=$p bash "$TOP/scripts/boot.sh" x86_64 "$tmp" "$tmp/none.cpio" "$tmp/console" 10 \
	>/dev/null 2>"$tmp/qemu.err" || rc=$?
if [ $rc -eq 0 ]; then
	results+=("not ok pipeline/missing-qemu-speaks # boot.sh returned 0 without QEMU")
else
	expect missing-qemu-speaks "$tmp/qemu.err" 'qemu-system-x86_64 not found on PATH \(Debian package qemu-system-x86'
fi

# 5. cpio missing: packing the initramfs says so.
p=$(path_without cpio)
mkdir -p "$tmp/guest"
: >"$tmp/guest/init"
: >"$tmp/plan"
rc=0
PATH=$p bash "$TOP/scripts/initramfs.sh" "$tmp/guest" "$tmp/plan" "$tmp/out.cpio" \
	>/dev/null 2>"$tmp/cpio.err" || rc=$?
if [ $rc -eq 0 ]; then
	results+=("not ok pipeline/missing-cpio-speaks # initramfs.sh returned 0 without cpio")
else
	expect missing-cpio-speaks "$tmp/cpio.err" 'cpio not found on PATH \(Debian package cpio'
fi

# 6. deps.sh names every program the pipeline calls that a base Debian 12
#    image lacks (rsync for headers_install was missing once).
for pkg in rsync kmod cpio ccache flex bison bc file qemu-system-x86 qemu-system-misc; do
	grep -qE "(^|[ (])$pkg( |\$|\))" "$TOP/scripts/deps.sh" ||
		{ results+=("not ok pipeline/deps-complete # scripts/deps.sh does not install $pkg"); pkg=; break; }
done
[ -z "$pkg" ] || results+=("ok pipeline/deps-complete")

# 7. A guest clock far ahead of the host's wall time (the host's TSC moved
#    under QEMU, as when the CI machine was migrated mid-run) is told from
#    a normal console, whose kernel timestamps stay below it.
printf '[    0.000000] Linux version\nx [  99.5] not at a line start\n[  170.250000] last line\n' >"$tmp/calm.console"
printf '[    0.000000] Linux version\n[125536.798464] rcu: INFO: rcu_sched detected stalls\n' >"$tmp/jump.console"
calm=$(guest_clock_ahead "$tmp/calm.console" 183)
jump=$(guest_clock_ahead "$tmp/jump.console" 183)
if [ "$calm" = 0 ] && [ "$jump" = 125353 ]; then
	results+=("ok pipeline/guest-clock-jump-detected")
else
	results+=("not ok pipeline/guest-clock-jump-detected # ahead: calm console $calm (want 0), jumped console $jump (want 125353)")
fi

write_tap "$out" "${results[@]}"
