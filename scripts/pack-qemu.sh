#!/usr/bin/env bash
# pack-qemu.sh LANE OUT: the tree the clients step adds to LANE's initramfs
# (docs/clients.md), written to the directory OUT:
#   usr/bin/qemu-system-x86_64   Debian 12's own binary (qemu-system-x86) for
#                                the lane's architecture, dynamic as shipped
#   its ELF interpreter and shared-library closure (NEEDED, recursively),
#   the TCG accelerator module and its closure, the firmware a `-M pc`
#   guest booted with -kernel (multiboot) reads: SeaBIOS bios-256k.bin,
#   multiboot_dma.bin, kvmvapic.bin
#   bin/busybox, bin/sh, bin/cat Debian's busybox-static, fetched with
#                                apt-get download (QEMU's exec: migration
#                                runs /bin/sh -c "cat > file")
#   usr/share/uffdwp/records-x86.elf  the nested VM (clients/records-x86.c)
# The files come from the Debian packages: for the host's architecture from
# the installed ones (scripts/deps.sh installs them), for another one from
# the .debs that `apt-get download` fetches into $CACHE/debs/ARCH and dpkg -x
# unpacks there; nothing foreign is installed on the host.
. "$(dirname "$0")/lib.sh"
load_lane "$1"
out=$2
case $ARCH in
x86_64) darch=amd64 triplet=x86_64-linux-gnu ;;
arm64) darch=arm64 triplet=aarch64-linux-gnu ;;
ppc64le) darch=ppc64el triplet=powerpc64le-linux-gnu ;;
*) die "lane $LANE ($ARCH): Debian 12 ships no qemu-system build for this architecture; the clients step does not run here (docs/clients.md)" ;;
esac
need_cmd readelf binutils
need_cmd dpkg-deb dpkg
hostarch=$(dpkg --print-architecture)
if [ "$darch" = "$hostarch" ]; then
	root=/
	for p in qemu-system-x86 seabios; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
			die "$p is not installed (scripts/deps.sh LANE installs it)"
	done
else
	root=$CACHE/debs/$darch/root
	"$TOP/scripts/fetch-foreign-qemu.sh" "$darch" "$root" >&2
fi

rm -rf "$out"
mkdir -p "$out/usr/bin" "$out/usr/lib/$triplet/qemu" "$out/bin" "$out/usr/share/qemu" \
	"$out/usr/share/seabios" "$out/usr/share/uffdwp"
# usrmerge, as Debian 12: /lib and /lib64 are /usr's.
ln -s usr/lib "$out/lib"
ln -s usr/lib64 "$out/lib64"

# find_in_root PATH: PATH (absolute, as the guest sees it) inside $root,
# following symlinks within $root.
find_in_root() {
	local p=$1 i
	for i in 1 2 3 4 5 6 7 8; do
		if [ -L "$root$p" ]; then
			local t
			t=$(readlink "$root$p")
			case $t in
			/*) p=$t ;;
			*) p=$(dirname "$p")/$t ;;
			esac
			p=$(realpath -m -s "$p")
			continue
		fi
		[ -e "$root$p" ] && { echo "$root$p"; return 0; }
		# usrmerge: /lib/x is /usr/lib/x
		case $p in
		/lib/* | /lib64/*) p=/usr$p; continue ;;
		esac
		return 1
	done
	return 1
}

# put SRC GUESTPATH: copy a file (dereferenced) into the tree.
put() {
	mkdir -p "$(dirname "$out$2")"
	cp -L "$1" "$out$2"
}

libdirs=("/usr/lib/$triplet" "/lib/$triplet" /usr/lib /lib /usr/lib64 /lib64)
declare -A seen=()
# closure FILE...: FILE's NEEDED libraries, recursively, into usr/lib/TRIPLET.
closure() {
	local queue=("$@") f lib d src
	while [ ${#queue[@]} -gt 0 ]; do
		f=${queue[0]}
		queue=("${queue[@]:1}")
		for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
			[ -z "${seen[$lib]:-}" ] || continue
			seen[$lib]=1
			src=
			for d in "${libdirs[@]}"; do
				src=$(find_in_root "$d/$lib") && break
			done
			[ -n "$src" ] || die "pack-qemu: $lib (needed by ${f#"$root"}) not found under $root"
			put "$src" "/usr/lib/$triplet/$lib"
			queue+=("$src")
		done
	done
}

qemu=$(find_in_root /usr/bin/qemu-system-x86_64) || die "no qemu-system-x86_64 under $root"
put "$qemu" /usr/bin/qemu-system-x86_64
interp=$(readelf -l "$qemu" | sed -n 's/.*\[Requesting program interpreter: \(.*\)\]/\1/p')
[ -n "$interp" ] || die "pack-qemu: $qemu has no ELF interpreter"
src=$(find_in_root "$interp") || die "pack-qemu: interpreter $interp not under $root"
# The interpreter at its own path (e.g. /lib64/ld-linux-x86-64.so.2), as a
# file under usr/ since /lib64 and /lib are links to there.
case $interp in
/lib/* | /lib64/*) put "$src" "/usr$interp" ;;
*) put "$src" "$interp" ;;
esac
seen[$(basename "$interp")]=1
closure "$qemu"
# QEMU 7.2 as Debian builds it loads TCG as a module.
accel=$(find_in_root "/usr/lib/$triplet/qemu/accel-tcg-x86_64.so") ||
	die "pack-qemu: no accel-tcg-x86_64.so under $root (qemu-system-common)"
put "$accel" "/usr/lib/$triplet/qemu/accel-tcg-x86_64.so"
closure "$accel"

# Firmware: QEMU looks in ../share/qemu and ../share/seabios beside its binary.
bios=$(find_in_root /usr/share/seabios/bios-256k.bin) || die "no bios-256k.bin under $root (seabios)"
put "$bios" /usr/share/seabios/bios-256k.bin
for fw in multiboot_dma.bin kvmvapic.bin; do
	src=$(find_in_root "/usr/share/qemu/$fw") || die "no $fw under $root (qemu-system-data)"
	put "$src" "/usr/share/qemu/$fw"
done

# busybox-static is never installed on the host (it would replace the
# host's busybox): its .deb is fetched and unpacked, for every architecture.
bbroot=$CACHE/debs/$darch/busybox-static
if [ ! -x "$bbroot/bin/busybox" ]; then
	mkdir -p "$CACHE/debs/$darch"
	rm -f "$CACHE/debs/$darch"/busybox-static_*.deb
	if ! (cd "$CACHE/debs/$darch" && apt-get download -q "busybox-static:$darch" >/dev/null 2>&1); then
		apt-get update -qq
		(cd "$CACHE/debs/$darch" && apt-get download -q "busybox-static:$darch" >/dev/null) ||
			die "apt-get download busybox-static:$darch failed"
	fi
	rm -rf "$bbroot"
	dpkg -x "$CACHE/debs/$darch"/busybox-static_*.deb "$bbroot"
fi
bb=$bbroot/bin/busybox
[ -x "$bb" ] || die "no bin/busybox in busybox-static:$darch"
readelf -l "$bb" | grep -q 'program interpreter' && die "$bb is not static (want busybox-static)"
put "$bb" /bin/busybox
ln -s busybox "$out/bin/sh"
ln -s busybox "$out/bin/cat"

make -s -C "$TOP" -f clients/clients.mk OUT="$BUILD/clients" >&2
cp "$BUILD/clients/records-x86.elf" "$out/usr/share/uffdwp/"
step "pack-qemu $LANE: $(du -sm "$out" | cut -f1) MiB, $(find "$out" -type f | wc -l) files ($darch)"
