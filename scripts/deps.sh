#!/usr/bin/env bash
# deps.sh [LANE...]: install the Debian packages the pipeline and the
# default lanes need, and each named lane's QEMU_PKG and LANE_PKGS (lanes
# outside the default set, arm64 for one, bring their own), skipping what
# is present.
. "$(dirname "$0")/lib.sh"

# Every program the pipeline or the kernel build calls, named by the package
# that brings it: a new Debian 12 machine has only its base image.
#   kernel build: gcc make flex bison bc libelf-dev libssl-dev rsync
#                 (headers_install) kmod (depmod) xz-utils zstd cpio
#   pipeline:     git perl (checkpatch) python3 ccache file (lane.sh run)
#                 util-linux (flock) coreutils findutils binutils (objdump,
#                 the ABI check) mandoc (the manual pages' lint) pkgconf
#                 (examples are built through pkg-config)
#   guests:       qemu-system-x86, qemu-system-misc (riscv64), the riscv64
#                 cross compiler and its libc
pkgs=(linux-source-6.12 qemu-system-x86 qemu-system-misc
      gcc make flex bison bc libelf-dev libssl-dev rsync kmod cpio xz-utils zstd
      ccache python3 git perl file util-linux findutils binutils mandoc pkgconf
      gcc-riscv64-linux-gnu libc6-dev-riscv64-cross)
[ -z "${EXTRA_PKGS:-}" ] || read -r -a extra <<<"$EXTRA_PKGS"
for lane in "$@"; do
	read -r -a more <<<"$(load_lane "$lane" >/dev/null && echo "$QEMU_PKG ${LANE_PKGS:-}")"
	extra+=("${more[@]}")
done
missing=()
for p in "${pkgs[@]}" ${extra[@]+"${extra[@]}"}; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
		missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
[ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}) and not root: install them with apt-get"
step "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
step "packages installed"
