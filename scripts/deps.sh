#!/usr/bin/env bash
# Install the Debian packages the pipeline needs, skipping what is present.
. "$(dirname "$0")/lib.sh"

pkgs=(linux-source-6.12 qemu-system-x86 qemu-system-misc
      gcc make flex bison bc libelf-dev libssl-dev cpio xz-utils ccache
      python3 git perl gcc-riscv64-linux-gnu libc6-dev-riscv64-cross)
[ -z "${EXTRA_PKGS:-}" ] || read -r -a extra <<<"$EXTRA_PKGS"
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
