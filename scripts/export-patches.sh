#!/usr/bin/env bash
# export-patches.sh: write the commits of build/linux past "base" to
# kernel/patches (git format-patch) and list them in kernel/series.
. "$(dirname "$0")/lib.sh"
src=$BUILD/linux
[ -d "$src/.git" ] || die "no build/linux: run 'make kernel-tree' first"
if [ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]; then
	git -C "$src" status --short --untracked-files=no >&2
	die "build/linux has uncommitted changes: commit them first"
fi
rm -f "$TOP"/kernel/patches/*.patch
mkdir -p "$TOP/kernel/patches"
# The cover letter's text lives in kernel/cover-letter.txt (first line: the
# subject); format-patch adds the shortlog and diffstat.
cover=$TOP/kernel/cover-letter.txt
[ -f "$cover" ] || die "no $cover: the series needs its cover letter"
git -C "$src" format-patch -q --no-signature --cover-letter -o "$TOP/kernel/patches" base..HEAD
letter=$TOP/kernel/patches/0000-cover-letter.patch
python3 - "$letter" "$cover" <<'PY'
import sys
letter, cover = sys.argv[1:3]
subject, _, body = open(cover).read().partition("\n")
text = open(letter).read()
text = text.replace("*** SUBJECT HERE ***", subject.strip())
text = text.replace("*** BLURB HERE ***", body.strip("\n"))
open(letter, "w").write(text)
PY
grep -q 'HERE \*\*\*' "$letter" && die "the cover letter still has format-patch's placeholders"
{
	echo "# Applied in order with 'git am' to Debian's $TREE_PKG tree."
	echo "# 0000-cover-letter.patch is the series' cover letter, not a patch."
	(cd "$TOP/kernel/patches" && ls -- *.patch 2>/dev/null | grep -v '^0000-' || true)
} >"$TOP/kernel/series"
step "exported $(git -C "$src" rev-list --count base..HEAD) patch(es) to kernel/patches"
