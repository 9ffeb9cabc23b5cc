#!/usr/bin/env bash
# check-abi.sh TAP_OUT: libuffdwp's ABI as the build machine builds it.
# The public header, the hand-kept symbol map (lib/libuffdwp.map) and the
# shared library agree: every function the header declares is in the map,
# the library exports exactly the map's symbols, each under its version
# node, and its soname is libuffdwp.so.0.
. "$(dirname "$0")/lib.sh"
out=$1
results=()
log=$BUILD/results/abi-build.log
mkdir -p "$BUILD/results"
: >"$log"
if ! make -s -C "$TOP" lib >>"$log" 2>&1; then
	results+=("not ok abi/build # make lib failed: $(tail -n 3 "$log" | tr '\n' ' ')")
else
	so=$(readlink -f "$BUILD/host/libuffdwp.so")
	header=$(grep -oE '^[a-z_ ]+\**[[:space:]]*\**uffdwp_[a-z_]+\(' "$TOP/include/uffdwp.h" |
		grep -oE 'uffdwp_[a-z_]+\($' | tr -d '(' | sort -u)
	map=$(sed -n 's/^[[:space:]]*\(uffdwp_[a-z_]*\);$/\1/p' "$TOP/lib/libuffdwp.map" | sort -u)
	exported=$(objdump -T "$so" | awk '$2 == "g" && /\.text/ { print $NF }' | sort -u)
	versions=$(objdump -T "$so" | awk '$2 == "g" && /\.text/ { print $(NF-1) }' | sort -u)
	soname=$(objdump -p "$so" | awk '$1 == "SONAME" { print $2 }')
	d=$(comm -3 <(echo "$header") <(echo "$map") | tr -s '\t ' ' ' | tr '\n' ' ')
	[ -z "$d" ] && results+=("ok abi/header-matches-map") ||
		results+=("not ok abi/header-matches-map # in one but not the other: $d")
	d=$(comm -3 <(echo "$map") <(echo "$exported") | tr -s '\t ' ' ' | tr '\n' ' ')
	[ -z "$d" ] && results+=("ok abi/exports-match-map") ||
		results+=("not ok abi/exports-match-map # in one but not the other: $d")
	bad=$(grep -v '^LIBUFFDWP_[0-9.]*$' <<<"$versions" || true)
	[ -z "$bad" ] && [ -n "$versions" ] && results+=("ok abi/versioned-symbols # $(echo $versions)") ||
		results+=("not ok abi/versioned-symbols # symbol versions: $(echo $versions)")
	[ "$soname" = libuffdwp.so.0 ] && results+=("ok abi/soname") ||
		results+=("not ok abi/soname # $soname, want libuffdwp.so.0")
	# What is installed: examples/ build against it through pkg-config
	# and the installed uffdwp.pc, linked to the shared library.
	prefix=$(mktemp -d)
	trap 'rm -rf "$prefix"' EXIT
	if ! make -s -C "$TOP" install PREFIX="$prefix" >>"$log" 2>&1; then
		results+=("not ok abi/install # make install failed: $(tail -n 2 "$log" | tr '\n' ' ')")
	else
		for ex in "$TOP"/examples/*.c; do
			name=$(basename "$ex" .c)
			bin=$prefix/$name
			# shellcheck disable=SC2046
			if ! gcc -std=gnu11 -Wall -Wextra -Werror -o "$bin" "$ex" \
				$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs uffdwp) \
				>>"$log" 2>&1; then
				results+=("not ok abi/example-$name-builds # against the installed library: see $log")
			elif ! objdump -p "$bin" | grep -q 'NEEDED.*libuffdwp\.so\.0'; then
				results+=("not ok abi/example-$name-builds # not linked to libuffdwp.so.0")
			else
				results+=("ok abi/example-$name-builds # pkg-config, shared library")
			fi
		done
	fi
fi
write_tap "$out" "${results[@]}"
