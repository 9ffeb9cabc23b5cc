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
gnuplot: the primary metric against the first param that varies (log-log
when it spans 16x or more), one line per variant and remaining params.

Sweeps (`make bench-sweep`, a param size_mib with three or more values):
each metric of FIT_METRICS is fitted as intercept + slope * GiB per variant
and remaining params; the table, the CSV (METRIC_fit_slope, _fit_slope_se,
_fit_slope_min/_max, _fit_intercept, _fit_growth: largest size over
smallest) and the plots (dashed lines) carry the fits.  dirty-harvest
sweeps also get the cost of 1000 more pages written
(round_us_per_1000_pages).
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
    "qemu-snapshot": "stop_copy",
}
PRIMARY = {
    "write-tracking": "fault_ns",
    "protect-range": "protect_us",
    "dirty-harvest": "round_us",
    "async-fault": "fault_ns",
    "snapshot": "pause_us",
    "qemu-snapshot": "downtime_ms",
}
FIELDS = ["benchmark", "variant", "param", "metric", "value", "unit"]
# Sweeps (`make bench-sweep`): metrics fitted against the swept size
# (param size_mib, at least three sizes) as value = intercept + slope * GiB.
FIT_METRICS = {
    "dirty-harvest": ["round_us"],
    "snapshot": ["pause_us", "writer_max_us", "peak_extra_mib"],
}


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


def linfit(pts):
    """Least squares y = a + b x over [(x, y)]: (a, b, standard error of b)."""
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return my, 0.0, 0.0
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    a = my - b * mx
    if n < 3:
        return a, b, 0.0
    res = sum((y - a - b * x) ** 2 for x, y in pts)
    return a, b, math.sqrt(res / (n - 2) / sxx)


def fits(figures):
    """Per benchmark, variant, fitted metric and the other params: the fit
    of the median against size_mib (in GiB), the slopes through the
    per-size minima and maxima (the spread), and the growth from the
    smallest to the largest size.  {key: dict}."""
    groups = collections.OrderedDict()
    for (bench, var, param, metric, unit), vals in figures.items():
        if metric not in FIT_METRICS.get(bench, []):
            continue
        p = param_dict(param)
        if "size_mib" not in p:
            continue
        try:
            gib = float(p["size_mib"]) / 1024
        except ValueError:
            continue
        rest = ";".join("%s=%s" % (k, v) for k, v in p.items() if k != "size_mib")
        groups.setdefault((bench, var, rest, metric, unit), []).append(
            (gib, statistics.median(vals), min(vals), max(vals)))
    out = collections.OrderedDict()
    for key, pts in groups.items():
        if len({x for x, *_ in pts}) < 3:
            continue
        pts.sort()
        a, b, se = linfit([(x, m) for x, m, _, _ in pts])
        _, blo, _ = linfit([(x, lo) for x, _, lo, _ in pts])
        _, bhi, _ = linfit([(x, hi) for x, _, _, hi in pts])
        growth = pts[-1][1] / pts[0][1] if pts[0][1] else float("nan")
        out[key] = {"intercept": a, "slope": b, "slope_se": se,
                    "slope_lo": min(b, blo, bhi), "slope_hi": max(b, blo, bhi),
                    "growth": growth, "from_gib": pts[0][0], "to_gib": pts[-1][0]}
    return out


def per_kpages(figures):
    """dirty-harvest sweeps: per variant and size, the extra cost of 1000
    more pages written, (round(K2) - round(K1)) / (K2 - K1) * 1000 for the
    smallest and largest K; the mean over the sizes.  {variant: (mean, lo, hi)}."""
    by = collections.defaultdict(dict)
    for (bench, var, param, metric, unit), vals in figures.items():
        if bench != "dirty-harvest" or metric != "round_us":
            continue
        p = param_dict(param)
        if "size_mib" not in p or "written_pages" not in p:
            continue
        rest = ";".join("%s=%s" % (k, v) for k, v in p.items()
                        if k not in ("size_mib", "written_pages"))
        by[(var, rest, p["size_mib"])][int(p["written_pages"])] = statistics.median(vals)
    per = collections.defaultdict(list)
    for (var, rest, _), ks in by.items():
        if len(ks) < 2:
            continue
        k1, k2 = min(ks), max(ks)
        per[(var, rest)].append((ks[k2] - ks[k1]) / (k2 - k1) * 1000)
    return {v: (statistics.mean(xs), min(xs), max(xs)) for v, xs in per.items()}


def print_fits(fitted, kpages):
    if not fitted:
        return
    print("\nfits against the size tracked (value = intercept + slope * GiB, from the medians;"
          " slope range: the fits through the medians, the per-size minima and the maxima)")
    print("  %-14s %-20s %-18s %-15s %14s %10s %22s %8s" %
          ("benchmark", "variant", "params", "metric", "slope/GiB", "+-se", "slope range", "growth"))
    for (bench, var, rest, metric, unit), f in fitted.items():
        print("  %-14s %-20s %-18s %-15s %14s %10s %22s %7.2fx" %
              (bench, var, rest or "-", metric, fmt(f["slope"]) + " " + unit,
               fmt(f["slope_se"]), "%s..%s" % (fmt(f["slope_lo"]), fmt(f["slope_hi"])),
               f["growth"]))
        print("  %-14s %-20s %-18s %-15s intercept %s %s; %g GiB -> %g GiB" %
              ("", "", "", "", fmt(f["intercept"]), unit, f["from_gib"], f["to_gib"]))
    for (var, rest), (m, lo, hi) in kpages.items():
        print("  dirty-harvest  %-20s %-18s per 1000 pages written: %s us (over the sizes %s..%s)" %
              (var, rest or "-", fmt(m), fmt(lo), fmt(hi)))


def write_csv(figures, path, fitted=None, kpages=None):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for (bench, var, param, metric, unit), vals in figures.items():
            med = statistics.median(vals)
            w.writerow([bench, var, param, metric, "%.6g" % med, unit])
            w.writerow([bench, var, param, metric + "_min", "%.6g" % min(vals), unit])
            w.writerow([bench, var, param, metric + "_max", "%.6g" % max(vals), unit])
            w.writerow([bench, var, param, metric + "_n", len(vals), "count"])
        for (bench, var, rest, metric, unit), f in (fitted or {}).items():
            for name, val, u in (("fit_slope", f["slope"], unit + "/GiB"),
                                 ("fit_slope_se", f["slope_se"], unit + "/GiB"),
                                 ("fit_slope_min", f["slope_lo"], unit + "/GiB"),
                                 ("fit_slope_max", f["slope_hi"], unit + "/GiB"),
                                 ("fit_intercept", f["intercept"], unit),
                                 ("fit_growth", f["growth"], "x")):
                w.writerow([bench, var, rest or "all", metric + "_" + name, "%.6g" % val, u])
        for (var, rest), (m, lo, hi) in (kpages or {}).items():
            for name, val in (("", m), ("_min", lo), ("_max", hi)):
                w.writerow(["dirty-harvest", var, rest or "all",
                            "round_us_per_1000_pages" + name, "%.6g" % val, "us"])


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


def plots(lane, figures, outdir, fitted=None):
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
        # x: the first param that varies (a sweep's swept value).
        values = collections.OrderedDict()
        for k in keys:
            for n, v in param_dict(k[2]).items():
                values.setdefault(n, set()).add(v)
        xname = next((n for n, vs in values.items() if len(vs) > 1),
                     next(iter(values), None))
        for k in keys:
            p = param_dict(k[2])
            names = list(p)
            if not names or xname not in p:
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
        logx = min(xs) > 0 and max(xs) / min(xs) >= 16
        svg = os.path.join(outdir, "%s-%s.svg" % (lane, bench))
        plot = ", ".join(
            "'%s' index %d using 1:2:3:4 with yerrorlines title '%s'" %
            (data, i, label.replace("'", "")) for i, label in enumerate(series))
        # Fitted lines of a sweep (x in MiB, the fit in GiB).
        for (fb, var, rest, fm, _), f in (fitted or {}).items():
            if fb != bench or fm != metric or xname != "size_mib":
                continue
            plot += ", %g + %g * x / 1024 with lines dashtype 2 title 'fit %s%s'" % (
                f["intercept"], f["slope"], var, (" " + rest.replace(";", ",")) if rest else "")
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
    fitted = fits(figures)
    kpages = per_kpages(figures)
    write_csv(figures, out, fitted, kpages)
    table(lane, figures)
    print_fits(fitted, kpages)
    made = plots(lane, figures, plotdir, fitted)
    print("\nCSV: %s\nplots: %s" % (out, " ".join(made) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
