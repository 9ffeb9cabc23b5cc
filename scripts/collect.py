#!/usr/bin/env python3
"""collect.py: turn a guest's serial console into the lane's TAP results.

    collect.py LANE CONSOLE PLAN TAP_OUT [EXPECTED_SKIPS]
    collect.py --splats CONSOLE

The second form prints the kernel report lines of a console (the one
definition every script uses: make check, make run, make soak) and exits 1
if there are any.

The guest's PID 1 (guest/init.c) frames every plan entry with @@BEGIN/@@END
and prefixes each line the entry printed with "@@O ".  Each plan entry has a
kind that says how its output is judged:

  exit       one result: ok on exit 0, skip on exit 4 (KSFT_SKIP) with the
             entry's last line as the reason, otherwise not ok.
  tap        the entry prints TAP; every result line becomes SUITE/NAME,
             where SUITE is the first part of the plan name (plan entry
             "conformance/api" printing "ok 1 api-register" gives
             "conformance/api-register").  A short count against the
             entry's plan, or a non-zero exit, adds a failure.
  ksft       kselftest output: exit 0, a non-empty plan, every planned
             subtest reported, none failed, and at least one passed
             (pagemap_ioctl exits 0 with no tests run when async WP is
             missing, so the exit code alone proves nothing).
  uffd-unit  uffd-unit-tests: exit 0, its totals line with fail=0 and
             pass>0, and no skipped subtest (it skips what the kernel lacks,
             e.g. every WP test without uffd-wp, and still exits 0).

Besides the plan entries the lane gets kernel/boot (PID 1 started),
guest/setup (mounts and swap worked) and kernel/console-clean (no kernel
BUG, WARNING, Oops, panic, KASAN, UBSAN, lockdep, list corruption, hung
task, soft lockup or RCU stall in the log).  An entry that never reported
(the guest hung, panicked or timed out) fails.

On stderr it prints one line per lane: the fuzzer's operations (from its
"# fuzz: ops=N" line), the race/ cases run and failed, and the number of
kernel report lines in the console.

EXPECTED_SKIPS (lanes/NAME.skips) lists the skips the lane expects, one
"TEST # reason" a line.  Any other skip fails ("unexpected skip"): a
feature probe that regresses must not turn cases into quiet skips.  An
expected skip that passed, or did not run at all, is named on stderr and
in a TAP comment, so the list is kept current.

Exit status: 0 when nothing failed, 1 otherwise.
"""
import re
import sys

SPLATS = re.compile(
    r"BUG:|WARNING:|Oops|Kernel panic|KASAN:|UBSAN:|kmemleak: .*new suspected"
    r"|unreferenced object|possible circular locking|possible recursive locking"
    r"|inconsistent lock state|suspicious RCU usage|list_add corruption"
    r"|list_del corruption|blocked for more than|soft lockup|hard LOCKUP"
    r"|rcu_.* detected stalls|general protection fault|Unable to handle kernel"
    r"|Bad page state|Bad page map|Bad rss-counter")


class Entry:
    def __init__(self, name, kind):
        self.name, self.kind = name, kind
        self.out, self.status, self.ms = [], None, None


def parse_console(path):
    entries, kernel, warns, booted, done = [], [], [], None, False
    cur = None
    with open(path, errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n").replace("\r", "")
            at = line.find("@@")
            if at < 0:
                kernel.append(line)
                continue
            if at > 0:          # a kernel message ran into our line
                kernel.append(line[:at])
                line = line[at:]
            if line.startswith("@@O "):
                if cur:
                    cur.out.append(line[4:])
            elif line.startswith("@@BEGIN "):
                parts = line.split()
                cur = Entry(parts[1], parts[2] if len(parts) > 2 else "exit")
                entries.append(cur)
            elif line.startswith("@@END "):
                parts = line.split()
                if cur and cur.name == parts[1]:
                    cur.status = parts[2]
                    cur.ms = parts[3][3:] if len(parts) > 3 else "?"
                cur = None
            elif line.startswith("@@BOOT"):
                booted = line[7:]
            elif line.startswith("@@WARN"):
                warns.append(line[7:])
            elif line.startswith("@@DONE"):
                done = True
    return entries, kernel, warns, booted, done


def plan_names(path):
    names = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if line:
                names.append(line[0])
    return names


def exit_code(e):
    if e.status and e.status.startswith("exit="):
        return int(e.status[5:])
    return None


def describe(e):
    if e.status is None:
        return "no result: the guest stopped while it ran"
    if e.status == "timeout":
        return "timed out after %s ms" % e.ms
    if e.status.startswith("signal="):
        return "killed by signal %s" % e.status[7:]
    return "%s" % e.status


def last_line(e):
    for line in reversed(e.out):
        if line.strip():
            return line.strip()[:200]
    return "no output"


def judge_exit(e):
    code = exit_code(e)
    if code == 0:
        return [(True, e.name, None)]
    if code == 4:
        return [("skip", e.name, last_line(e))]
    return [(False, e.name, "%s; last line: %s" % (describe(e), last_line(e)))]


TAP_LINE = re.compile(r"^(not ok|ok)\b\s*(\d+)?\s*-?\s*([^#]*?)\s*(#\s*(.*))?$")


def judge_tap(e):
    results, planned = [], None
    suite = e.name.split("/", 1)[0]
    for line in e.out:
        m = re.match(r"^1\.\.(\d+)", line)
        if m:
            planned = int(m.group(1))
            continue
        m = TAP_LINE.match(line)
        if not m:
            continue
        ok = m.group(1) == "ok"
        name = "%s/%s" % (suite, m.group(3) or "test-%s" % m.group(2))
        directive = m.group(5) or ""
        if ok and directive.upper().startswith("SKIP"):
            reason = directive[4:].strip() or "no reason given"
            results.append(("skip", name, reason))
        else:
            results.append((ok, name, None if ok else directive or last_line(e)))
    code = exit_code(e)
    if planned is not None and len(results) != planned:
        results.append((False, e.name + "-plan",
                        "planned %d results, got %d (%s)" % (planned, len(results), describe(e))))
    elif planned is None:
        results.append((False, e.name + "-plan", "no TAP plan printed (%s)" % describe(e)))
    if code != 0 and all(r[0] is not False for r in results):
        results.append((False, e.name + "-exit", describe(e)))
    return results


def judge_ksft(e):
    planned, oks, fails, skips = None, 0, [], []
    for line in e.out:
        m = re.match(r"^1\.\.(\d+)", line)
        if m:
            planned = int(m.group(1))
            continue
        m = TAP_LINE.match(line)
        if not m:
            continue
        desc = (m.group(3) or "").strip()
        directive = m.group(5) or ""
        if m.group(1) == "not ok":
            fails.append(desc)
        elif directive.upper().startswith("SKIP"):
            skips.append(desc)
        else:
            oks += 1
    seen = oks + len(fails) + len(skips)
    problems = []
    if exit_code(e) != 0:
        problems.append(describe(e))
    if not planned:
        problems.append("no test plan: it ran nothing (last line: %s)" % last_line(e))
    elif seen != planned:
        problems.append("planned %d, reported %d" % (planned, seen))
    if fails:
        problems.append("%d failed: %s" % (len(fails), "; ".join(fails[:5])))
    if oks == 0:
        problems.append("no subtest passed")
    if skips:
        problems.append("%d skipped: %s" % (len(skips), "; ".join(skips[:5])))
    if problems:
        return [(False, e.name, "; ".join(problems))]
    return [(True, e.name, "%d subtests passed" % oks)]


def judge_uffd_unit(e):
    totals, skipped, failed = None, [], []
    for line in e.out:
        m = re.match(r"Userfaults unit tests: pass=(\d+), skip=(\d+), fail=(\d+)", line)
        if m:
            totals = tuple(int(x) for x in m.groups())
        m = re.match(r"Testing (.*)\.\.\. (skipped \[reason: (.*)\]|failed.*)$", line)
        if m:
            (skipped if m.group(3) is not None else failed).append(
                m.group(1) + (" (%s)" % m.group(3) if m.group(3) else ""))
    problems = []
    if exit_code(e) != 0:
        problems.append(describe(e))
    if totals is None:
        problems.append("no totals line (last line: %s)" % last_line(e))
    elif totals[2] or totals[0] == 0:
        problems.append("pass=%d skip=%d fail=%d" % totals)
    if failed:
        problems.append("failed: " + "; ".join(failed[:5]))
    # Every lane is configured for every subtest, so a skip means a feature
    # is missing (e.g. no uffd-wp): that must not read as a pass.
    if skipped:
        problems.append("%d skipped: %s" % (len(skipped), "; ".join(skipped[:5])))
    if problems:
        return [(False, e.name, "; ".join(problems))]
    return [(True, e.name, "pass=%d skip=0" % totals[0])]


JUDGES = {"exit": judge_exit, "tap": judge_tap, "ksft": judge_ksft,
          "uffd-unit": judge_uffd_unit}


def read_skips(path):
    """The expected skips: {test name: reason} from a .skips file."""
    skips = {}
    with open(path) as f:
        for line in f:
            name, _, reason = line.partition("#")
            if name.strip():
                skips[name.strip()] = reason.strip()
    return skips


def enforce_skips(results, expected):
    """Fail unexpected skips; return notes on expected ones that did not skip."""
    notes, seen = [], set()
    for i, (ok, name, note) in enumerate(results):
        if name in expected:
            seen.add(name)
            if ok is True:
                notes.append("expected skip now passes: %s (drop it from the list)" % name)
        elif ok == "skip":
            results[i] = (False, name, "unexpected skip: %s" % note)
    notes += ["expected skip did not run: %s" % n for n in sorted(set(expected) - seen)]
    return notes


def splat_lines(console):
    """Kernel report lines of a console (SPLATS), test output excluded."""
    return [l for l in parse_console(console)[1] if SPLATS.search(l)]


def main():
    if sys.argv[1:2] == ["--splats"]:
        splats = splat_lines(sys.argv[2])
        for l in splats:
            print(l.strip())
        return 1 if splats else 0
    lane, console, plan, out = sys.argv[1:5]
    skips_file = sys.argv[5] if len(sys.argv) > 5 else None
    entries, kernel, warns, booted, done = parse_console(console)
    results = [(bool(booted), "kernel/boot",
                booted.strip() if booted else "PID 1 never reported (see the console)")]
    results.append((not warns, "guest/setup", "; ".join(warns) or None))
    by_name = {}
    for e in entries:
        by_name.setdefault(e.name, e)
    for name in plan_names(plan):
        e = by_name.get(name)
        if e is None:
            results.append((False, name, "never ran: the guest stopped before it"))
            continue
        judge = JUDGES.get(e.kind)
        if judge is None:
            results.append((False, name, "unknown kind %r in the plan" % e.kind))
            continue
        if e.status is None or e.status == "timeout" or e.status.startswith("signal="):
            if e.kind == "tap":
                results.extend(r for r in judge_tap(e) if r[0] is not False)
            results.append((False, name, describe(e) + "; last line: " + last_line(e)))
            continue
        results.extend(judge(e))
    splats = splat_lines(console)
    results.append((not splats, "kernel/console-clean",
                    "%d report line(s), first: %s" % (len(splats), splats[0].strip()[:200])
                    if splats else None))
    if booted and not done and all(e.status for e in entries):
        results.append((False, "guest/done", "PID 1 did not finish the plan"))
    skip_notes = enforce_skips(results, read_skips(skips_file) if skips_file else {})

    with open(out, "w") as f:
        f.write("TAP version 13\n1..%d\n" % len(results))
        for i, (ok, name, note) in enumerate(results, 1):
            if ok == "skip":
                f.write("ok %d %s # SKIP %s\n" % (i, name, note))
            elif ok:
                # A note must not read as a SKIP/TODO directive.
                if note and re.match(r"(?i)(skip|todo)", note):
                    note = "-- " + note
                f.write("ok %d %s%s\n" % (i, name, " # " + note if note else ""))
            else:
                f.write("not ok %d %s # %s\n" % (i, name, note))
        for n in skip_notes:
            f.write("# %s\n" % n)
    for n in skip_notes:
        print("lane %s: %s" % (lane, n), file=sys.stderr)
    # One line per lane for the reliability work: how much the fuzzer and
    # the race tests ran, and how many kernel reports the console holds.
    ops = sum(int(m.group(1)) for e in entries for l in e.out
              for m in [re.search(r"# fuzz: ops=(\d+)", l)] if m)
    races = [r for r in results if r[1].startswith("race/")]
    print("lane %s: fuzz ops %d, race cases %d (%d failed), kernel reports %d"
          % (lane, ops, len(races), sum(1 for r in races if r[0] is False),
             len(splats)), file=sys.stderr)
    failed = [r for r in results if r[0] is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
