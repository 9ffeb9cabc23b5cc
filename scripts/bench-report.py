#!/usr/bin/env python3
"""bench-report.py: a lane's benchmark samples into its CSV, table and plots.

    bench-report.py LANE CONSOLE CSV_OUT PLOT_DIR

The guest's benchmark programs print one CSV row per repetition
(benchmark,variant,param,metric,value,unit) inside their @@O lines.  Rows
with the same benchmark, variant, param, metric and unit are one figure:
the CSV gets its median under the metric's name and the spread as
METRIC_min and METRIC_max (and METRIC_n, the number of repetitions).

The table printed on stdout shows each figure with its ratio to the
benchmark's baseline variant at the same param and metric (measured in the
same guest, in the same run: under TCG only such ratios mean anything) and
the spread as (max - min) / median.  One SVG per benchmark is drawn with
gnuplot: the primary metric against the first numeric param, one line per
variant and remaining params.
"""
import collections
import csv
import math
import os
import re
import statistics
import subprocess
import sys

BASELINE = {
    "write-tracking": "mprotect_segv",
    "protect-range": "mprotect",
    "dirty-harvest": "pagemap_scan",
    "async-fault": "no_ring",
    "snapshot": "fork",
}
PRIMARY = {
    "write-tracking": "fault_ns",
    "protect-range": "protect_us",
    "dirty-harvest": "round_us",
    "async-fault": "fault_ns",
    "snapshot": "pause_us",
}
FIELDS = ["benchmark", "variant", "param", "metric", "value", "unit"]


def samples(console):
    rows = collections.OrderedDict()
    with open(console, errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n").replace("\r", "")
            if not line.startswith("@@O "):
                continue
            line = line[4:].strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(",")
            if len(parts) != 6:
                continue
            try:
                value = float(parts[4])
            except ValueError:
                continue
            if not math.isfinite(value):
                continue
            key = (parts[0], parts[1], parts[2], parts[3], parts[5])
            rows.setdefault(key, []).append(value)
    return rows


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return "%.0f" % v
    if abs(v) >= 10:
        return "%.1f" % v
    return "%.3g" % v


def param_dict(param):
    out = collections.OrderedDict()
    for kv in param.split(";"):
        if "=" in kv:
            k, v = kv.split("=", 1)
            out[k] = v
    return out


def write_csv(figures, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for (bench, var, param, metric, unit), vals in figures.items():
            med = statistics.median(vals)
            w.writerow([bench, var, param, metric, "%.6g" % med, unit])
            w.writerow([bench, var, param, metric + "_min", "%.6g" % min(vals), unit])
            w.writerow([bench, var, param, metric + "_max", "%.6g" % max(vals), unit])
            w.writerow([bench, var, param, metric + "_n", len(vals), "count"])


def table(lane, figures):
    med = {k: statistics.median(v) for k, v in figures.items()}
    by_bench = collections.OrderedDict()
    for k in figures:
        by_bench.setdefault(k[0], []).append(k)
    print("benchmarks, lane %s (median of N; ratio to the baseline in the same run; spread = (max-min)/median)" % lane)
    for bench, keys in by_bench.items():
        base = BASELINE.get(bench)
        print("\n%s (baseline: %s)" % (bench, base or "none"))
        print("  %-28s %-14s %-22s %12s %9s %7s %3s" %
              ("param", "metric", "variant", "median", "ratio", "spread", "n"))
        keys = sorted(keys, key=lambda k: (k[3] != PRIMARY.get(bench), k[3], k[2], k[1]))
        for k in keys:
            _, var, param, metric, unit = k
            vals = figures[k]
            m = med[k]
            ratio = ""
            bk = (bench, base, param, metric, unit)
            if base and bk in med and med[bk] > 0 and not metric.startswith(("vmas", "verified")):
                ratio = "%.2fx" % (m / med[bk])
            spread = "%.0f%%" % (100 * (max(vals) - min(vals)) / m) if m else "-"
            print("  %-28s %-14s %-22s %12s %9s %7s %3d" %
                  (param, metric, var, fmt(m) + " " + unit, ratio, spread, len(vals)))


def plots(lane, figures, outdir):
    os.makedirs(outdir, exist_ok=True)
    made = []
    benches = collections.OrderedDict()
    for k in figures:
        benches.setdefault(k[0], []).append(k)
    for bench, keys in benches.items():
        metric = PRIMARY.get(bench)
        keys = [k for k in keys if k[3] == metric]
        if not keys:
            continue
        series = collections.OrderedDict()
        xname = None
        for k in keys:
            p = param_dict(k[2])
            names = list(p)
            if not names:
                continue
            xname = xname or names[0]
            if xname not in p:
                continue
            try:
                x = float(p[xname])
            except ValueError:
                continue
            rest = ",".join("%s=%s" % (n, p[n]) for n in names if n != xname)
            label = k[1] + (" " + rest if rest else "")
            vals = figures[k]
            series.setdefault(label, []).append(
                (x, statistics.median(vals), min(vals), max(vals)))
        if not series:
            continue
        unit = keys[0][4]
        data = os.path.join(outdir, "%s-%s.dat" % (lane, bench))
        with open(data, "w") as f:
            for label, pts in series.items():
                f.write("# %s\n" % label)
                for x, m, lo, hi in sorted(pts):
                    f.write("%g %g %g %g\n" % (x, m, lo, hi))
                f.write("\n\n")
        xs = [x for pts in series.values() for x, *_ in pts]
        logx = min(xs) > 0 and max(xs) / min(xs) >= 100
        svg = os.path.join(outdir, "%s-%s.svg" % (lane, bench))
        plot = ", ".join(
            "'%s' index %d using 1:2:3:4 with yerrorlines title '%s'" %
            (data, i, label.replace("'", "")) for i, label in enumerate(series))
        script = "\n".join([
            "set terminal svg size 800,500 dynamic font 'sans,11'",
            "set output '%s'" % svg,
            "set title '%s on %s: %s (median, bars min-max)'" % (bench, lane, metric),
            "set xlabel '%s'" % xname,
            "set ylabel '%s (%s)'" % (metric, unit),
            "set logscale y",
            "set logscale x" if logx else "set offsets 0.5,0.5,0,0",
            "set key outside right",
            "set grid",
            "plot " + plot,
        ])
        try:
            subprocess.run(["gnuplot"], input=script, text=True, check=True,
                           stderr=subprocess.PIPE)
            made.append(svg)
        except (OSError, subprocess.CalledProcessError) as e:
            print("warning: gnuplot failed for %s: %s" % (bench, getattr(e, "stderr", e)),
                  file=sys.stderr)
    return made


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    lane, console, out, plotdir = sys.argv[1:]
    figures = samples(console)
    if not figures:
        print("error: no benchmark rows in %s" % console, file=sys.stderr)
        return 1
    write_csv(figures, out)
    table(lane, figures)
    made = plots(lane, figures, plotdir)
    print("\nCSV: %s\nplots: %s" % (out, " ".join(made) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
