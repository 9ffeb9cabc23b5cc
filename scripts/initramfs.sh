#!/usr/bin/env bash
# initramfs.sh GUESTDIR PLAN OUT [EXTRA_BIN...]: pack PID 1, the binaries of
# GUESTDIR/bin (plus any EXTRA_BIN) and PLAN (as /plan) into a newc cpio;
# INITRAMFS_TREE adds a directory tree.
. "$(dirname "$0")/lib.sh"
guest=$1 plan=$2 out=$3
shift 3
need_cmd cpio cpio
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,dev,proc,sys,tmp,mnt/huge}
# mktemp makes a 0700 directory; as the guest's / it would lock out
# every unprivileged test.
chmod 755 "$stage"
cp "$guest/init" "$stage/init"
if [ -d "$guest/bin" ]; then
	find "$guest/bin" -maxdepth 1 -type f -exec cp {} "$stage/bin/" \;
fi
for b in "$@"; do
	cp "$b" "$stage/bin/"
done
cp "$plan" "$stage/plan"
# INITRAMFS_TREE: a directory whose contents go in as they are (the clients
# step's QEMU with its libraries, scripts/pack-qemu.sh).
if [ -n "${INITRAMFS_TREE:-}" ]; then
	cp -a "$INITRAMFS_TREE/." "$stage/"
fi
(cd "$stage" && find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"$out.tmp"
mv "$out.tmp" "$out"
