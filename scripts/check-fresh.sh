#!/usr/bin/env bash
# check-fresh.sh [TARGET]: run the README's first command (default `make
# demo`) the way a new user would, on a new Debian 12 root with nothing but
# its minimal base, `make` and `git`: mmdebstrap builds the root from the
# package archive this machine's apt uses, the committed tree is cloned
# into it, and TARGET runs there as root with an empty cache.  Nothing of
# the host is visible inside but /proc, /sys and /dev.  Reports the time
# and the result; the root stays in build/fresh/root for a look afterwards
# (removed at the next run).
#
# Slow (the kernel is compiled from nothing): run it when scripts/deps.sh
# or a lane's packages change, and record the result in README.
. "$(dirname "$0")/lib.sh"
target=${1:-demo}
[ "$(id -u)" -eq 0 ] || die "check-fresh needs root (mmdebstrap, chroot, mounts)"
EXTRA_PKGS=mmdebstrap "$TOP/scripts/deps.sh"
fresh=$BUILD/fresh
root=$fresh/root
log=$fresh/run.log

umount_all() {
	local m
	for m in dev/pts dev sys proc; do
		mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m"
	done
	return 0
}
trap umount_all EXIT
umount_all
rm -rf "$fresh"
mkdir -p "$fresh"

# The archive: whatever this machine's apt is configured with.
sources=
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
	[ -s "$f" ] && grep -qE '^(Types:|deb )' "$f" && { sources=$f; break; }
done
[ -n "$sources" ] || die "no apt sources on this machine to build the root from"

start=$(date +%s)
step "fresh: a minimal Debian 12 root in $root (from $sources)"
logged "$log" "mmdebstrap" mmdebstrap --variant=minbase --include=make,git,ca-certificates \
	bookworm "$root" "$sources"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# The clone: what is committed, as a user would get it.
git -C "$TOP" rev-parse HEAD >/dev/null
commit=$(git -C "$TOP" rev-parse --short HEAD)
git clone -q --no-hardlinks "$TOP" "$root/src"
step "fresh: cloned $commit into the root; running make $target there"

mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
mount -t devpts devpts "$root/dev/pts" 2>/dev/null || true

if chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
	PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	bash -c "cd /src && make $target" 2>&1 | tee -a "$log"; then
	rc=0
else
	rc=$?
fi
secs=$(($(date +%s) - start))
result=passed
[ "$rc" -eq 0 ] || result="failed (exit $rc)"
line="check-fresh: make $target on a new Debian 12 root $result in $((secs / 60)) min $((secs % 60)) s (commit $commit, $(date -u +%Y-%m-%d))"
echo "$line" | tee "$fresh/result.txt"
[ "$rc" -eq 0 ] || {
	printf 'error: make %s failed in the fresh root; last lines of %s:\n' "$target" "$log" >&2
	tail -n 30 "$log" | sed 's/^/  | /' >&2
	exit 1
}
