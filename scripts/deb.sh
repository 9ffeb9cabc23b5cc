#!/usr/bin/env bash
# deb.sh [TAP_OUT]: make deb.  Builds the libuffdwp0, libuffdwp-dev and
# uffdwp binary packages with Debian's tooling (dpkg-buildpackage -b from a
# copy of the tree in build/deb/src, so nothing lands outside build/), runs
# lintian on them (errors fail), then unpacks them (dpkg-deb -x, nothing is
# installed on this machine) and builds examples/ against what they hold
# through pkg-config.  With TAP_OUT, writes the results as TAP.
. "$(dirname "$0")/lib.sh"
out=${1:-}
EXTRA_PKGS="build-essential debhelper dpkg-dev lintian pkgconf" "$TOP/scripts/deps.sh"
dir=$BUILD/deb
log=$dir/build.log
results=()
rm -rf "$dir"
mkdir -p "$dir/src"
: >"$log"
# The working tree as git sees it (tracked and new files, no build/), less
# tracked files deleted and not yet committed.
(cd "$TOP" && git ls-files -z --cached --others --exclude-standard |
	while IFS= read -r -d '' f; do
		if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
	done | tar --null -T - -cf -) | tar -x -C "$dir/src"
step "deb: dpkg-buildpackage -b"
if (cd "$dir/src" && dpkg-buildpackage -b -us -uc) >>"$log" 2>&1; then
	results+=("ok deb/build # $(cd "$dir" && ls ./*.deb | tr '\n' ' ')")
else
	results+=("not ok deb/build # dpkg-buildpackage failed; last lines: $(tail -n 3 "$log" | tr '\n' ' ') (full log: $log)")
fi
debs=("$dir"/*.deb)
if [ -f "${debs[0]}" ]; then
	step "deb: lintian"
	lint=$(lintian --tag-display-limit 0 "${debs[@]}" 2>&1 || true)
	echo "$lint" >"$dir/lintian.txt"
	errs=$(grep -c '^E:' <<<"$lint" || true)
	warns=$(grep -c '^W:' <<<"$lint" || true)
	[ "$errs" -eq 0 ] && results+=("ok deb/lintian # 0 errors, $warns warning(s): $dir/lintian.txt") ||
		results+=("not ok deb/lintian # $errs error(s), first: $(grep -m1 '^E:' <<<"$lint")")
	root=$dir/root
	for d in "${debs[@]}"; do dpkg-deb -x "$d" "$root"; done
	triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
	for ex in "$TOP"/examples/*.c; do
		name=$(basename "$ex" .c)
		# shellcheck disable=SC2046
		if gcc -std=gnu11 -Wall -Wextra -Werror -static -o "$dir/$name" "$ex" \
			$(PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_LIBDIR=$root/usr/lib/$triplet/pkgconfig \
			  pkg-config --static --cflags --libs uffdwp) >>"$log" 2>&1; then
			results+=("ok deb/example-$name-builds # against the unpacked libuffdwp-dev")
		else
			results+=("not ok deb/example-$name-builds # see $log")
		fi
	done
fi
[ -z "$out" ] || write_tap "$out" "${results[@]}" || true
printf '%s\n' "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -q '^not ok'
