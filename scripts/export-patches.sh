#!/usr/bin/env bash
# export-patches.sh: write the commits of build/linux past "base" to the
# series' topics.  The series is kernel/series: it includes, in order, one
# series per topic (kernel/topics/N-name/series), each a posting of its own
# with its cover letter (cover-letter.txt in the topic's folder, first line
# the subject; format-patch adds the shortlog and diffstat) and its patches
# numbered from 1 in its patches/ folder.
#
# The commits are cut into topics by count: each topic keeps as many
# commits as its series lists now, in order.  After adding or removing a
# commit, say the new counts in kernel/series order, e.g.
#   TOPIC_COUNTS="13 5 24 4 7" make export-patches
. "$(dirname "$0")/lib.sh"
src=$BUILD/linux
[ -d "$src/.git" ] || die "no build/linux: run 'make kernel-tree' first"
if [ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]; then
	git -C "$src" status --short --untracked-files=no >&2
	die "build/linux has uncommitted changes: commit them first"
fi
series=$TOP/kernel/series
mapfile -t topics < <(series_topics "$series")
[ ${#topics[@]} -gt 0 ] || die "$series includes no topic series"
if [ -n "${TOPIC_COUNTS:-}" ]; then
	read -r -a counts <<<"$TOPIC_COUNTS"
else
	counts=()
	for t in "${topics[@]}"; do counts+=("$(series_patches "$t/series" | wc -l)"); done
fi
[ ${#counts[@]} -eq ${#topics[@]} ] ||
	die "TOPIC_COUNTS has ${#counts[@]} number(s) for ${#topics[@]} topics"
mapfile -t commits < <(git -C "$src" rev-list --reverse base..HEAD)
total=0
for c in "${counts[@]}"; do
	[[ $c =~ ^[0-9]+$ ]] || die "topic count '$c' is not a number"
	total=$((total + c))
done
[ "$total" -eq ${#commits[@]} ] ||
	die "the topics hold $total commit(s) (${counts[*]}), build/linux has ${#commits[@]}: set TOPIC_COUNTS"
at=0
i=0
for t in "${topics[@]}"; do
	n=${counts[$i]}
	i=$((i + 1))
	name=$(basename "$t")
	cover=$t/cover-letter.txt
	[ -f "$cover" ] || die "no $cover: topic $name needs its cover letter"
	[ "$n" -gt 0 ] || die "topic $name would have no patch"
	first=${commits[$at]}
	last=${commits[$((at + n - 1))]}
	at=$((at + n))
	rm -f "$t"/patches/*.patch
	mkdir -p "$t/patches"
	git -C "$src" format-patch -q --no-signature --cover-letter -o "$t/patches" "$first^..$last"
	letter=$t/patches/0000-cover-letter.patch
	python3 - "$letter" "$cover" <<'PY'
import sys
letter, cover = sys.argv[1:3]
subject, _, body = open(cover).read().partition("\n")
text = open(letter).read()
text = text.replace("*** SUBJECT HERE ***", subject.strip())
text = text.replace("*** BLURB HERE ***", body.strip("\n"))
open(letter, "w").write(text)
PY
	grep -q 'HERE \*\*\*' "$letter" && die "$name's cover letter still has format-patch's placeholders"
	{
		echo "# Topic $name, applied with 'git am' after the topics before it in"
		echo "# kernel/series.  patches/0000-cover-letter.patch is its cover letter."
		(cd "$t/patches" && ls -- *.patch | grep -v '^0000-')
	} >"$t/series"
	step "exported $n patch(es) to ${t#"$TOP"/}"
done
