#!/usr/bin/env bash
# fetch-foreign-qemu.sh DARCH ROOT: Debian 12's qemu-system-x86 for the
# Debian architecture DARCH (arm64, ppc64el) and every package its binary
# and its TCG module need at run time, fetched with `apt-get download` into
# $CACHE/debs/DARCH and unpacked with dpkg -x into ROOT.  Nothing is
# installed: the host's dpkg only learns that DARCH exists (dpkg
# --add-architecture, so that apt can read DARCH's package lists).
#
# The libraries are found by their ELF NEEDED entries, recursively; the
# package that ships a soname is the one that ships it on the host (Debian's
# library packages have one name on every architecture), so the host needs
# the amd64 QEMU installed (scripts/deps.sh) and nothing more.
. "$(dirname "$0")/lib.sh"
darch=$1 root=$2
case $darch in
arm64) triplet=aarch64-linux-gnu ;;
ppc64el) triplet=powerpc64le-linux-gnu ;;
*) die "fetch-foreign-qemu.sh: no QEMU to fetch for $darch" ;;
esac
need_cmd readelf binutils
debs=$CACHE/debs/$darch
# Done before for this ROOT: nothing to fetch.
[ -f "$root/.uffdwp-complete" ] && exit 0
mkdir -p "$debs" "$root"
hosttrip=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)

if ! dpkg --print-foreign-architectures | grep -qx "$darch"; then
	step "fetch-foreign-qemu: dpkg --add-architecture $darch (lists only; nothing is installed)"
	dpkg --add-architecture "$darch"
	apt-get update -qq
fi

# fetch PKG: download PKG for DARCH (or arch all) once and unpack it.
declare -A got=()
fetch() {
	local pkg=$1 deb
	[ -z "${got[$pkg]:-}" ] || return 0
	got[$pkg]=1
	deb=$(ls "$debs/${pkg}"_*.deb 2>/dev/null | head -1 || true)
	if [ -z "$deb" ]; then
		# An arch-all package (qemu-system-data, seabios) has no
		# :DARCH; _apt cannot write into the cache, so apt warns that it
		# downloads as root.
		(cd "$debs" && apt-get download -q "$pkg:$darch" >/dev/null 2>&1) ||
			(cd "$debs" && apt-get download -q "$pkg" >/dev/null 2>"$debs/.err") ||
			{ cat "$debs/.err" >&2; die "apt-get download $pkg:$darch failed"; }
		deb=$(ls "$debs/${pkg}"_*.deb | head -1)
	fi
	dpkg -x "$deb" "$root"
}

have_lib() {
	local d
	for d in "/usr/lib/$triplet" "/lib/$triplet" /usr/lib /lib /usr/lib64 /lib64; do
		[ -e "$root$d/$1" ] && return 0
	done
	return 1
}

# The package shipping soname LIB on the host, without its ":amd64".
host_pkg_of() {
	local p
	for p in "/usr/lib/$hosttrip/$1" "/lib/$hosttrip/$1"; do
		dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1 && return 0
	done
	return 1
}

for p in qemu-system-x86 qemu-system-common qemu-system-data seabios libc6; do
	fetch "$p"
done
# Resolve NEEDED until every library is there.
for round in 1 2 3 4 5 6 7 8 9 10; do
	missing=()
	while IFS= read -r f; do
		for lib in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
			have_lib "$lib" || missing+=("$lib")
		done
	done < <({
		echo "$root/usr/bin/qemu-system-x86_64"
		echo "$root/usr/lib/$triplet/qemu/accel-tcg-x86_64.so"
		# The libraries fetched so far (not QEMU's other modules:
		# display, audio, USB, which the nested VM does not use).
		find "$root/usr/lib/$triplet" "$root/lib/$triplet" -maxdepth 1 \
			-name '*.so*' -type f 2>/dev/null || true
	})
	[ ${#missing[@]} -gt 0 ] || break
	declare -A want=()
	for lib in $(printf '%s\n' "${missing[@]}" | sort -u); do
		pkg=$(host_pkg_of "$lib") ||
			die "fetch-foreign-qemu: no host package ships $lib (needed by the $darch QEMU); name it here"
		[ -z "${got[$pkg]:-}" ] ||
			die "fetch-foreign-qemu: $pkg:$darch does not ship $lib"
		want[$pkg]=1
	done
	for pkg in "${!want[@]}"; do
		fetch "$pkg"
	done
	unset want
done
step "fetch-foreign-qemu: $darch QEMU $(ls "$debs"/qemu-system-x86_*.deb | sed 's/.*qemu-system-x86_\([^_]*\)_.*/\1/'), ${#got[@]} packages in $debs"
touch "$root/.uffdwp-complete"
