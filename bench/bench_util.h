/* SPDX-License-Identifier: GPL-2.0 */
/*
 * bench_util.h: the few helpers the guest benchmarks (bench/<name>.c) share.
 *
 * Output follows the benchmark protocol: one CSV row per repetition,
 *	benchmark,variant,param,metric,value,unit
 * and '#' comment lines saying what is measured and how.  Every line goes to
 * fd 1 in a single write(), so lines stay whole across threads and fork().
 *
 * Typical use:
 *	struct bench_opts o;
 *	const char *sizes = bench_take_opt(&argc, argv, "--sizes"); // own option
 *	bench_parse_args(argc, argv, &o, 5);	// --quick, --reps N, --help
 *	bench_comment("fault_ns = wall time / pages");
 *	uint64_t t0 = bench_now_ns();
 *	...
 *	bench_sample("write-tracking", "uffd_thread", "pages=1024;threads=1",
 *		     "fault_ns", (bench_now_ns() - t0) / 1024.0, "ns");
 *	if (broken)
 *		bench_fail("uffd_thread: %zu of %zu faults", got, want);  // exit 1
 */
#ifndef UFFDWP_BENCH_UTIL_H
#define UFFDWP_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bench_opts {
	int reps;	/* repetitions per figure (--reps N; 1 with --quick) */
	bool quick;	/* --quick: tiny sizes, one repetition, checks only */
	bool reps_set;	/* --reps was given explicitly */
};

/*
 * Parse --quick, --reps N (1..100000) and --help into *O; DEFAULT_REPS is used
 * when --reps is absent (1 under --quick).  Anything else prints usage to
 * stderr and exits 2.
 */
void bench_parse_args(int argc, char **argv, struct bench_opts *o,
		      int default_reps);

/*
 * A program's own option "NAME VALUE" or "NAME=VALUE": removes it from argv
 * (updating *ARGC) and returns VALUE, or NULL when absent.  Exits 2 when
 * NAME has no value.  Call it before bench_parse_args(), which rejects
 * options it does not know.
 */
const char *bench_take_opt(int *argc, char **argv, const char *name);

/*
 * Parse LIST, comma-separated numbers in MIN..MAX that are multiples of
 * MULT, into OUT (at most MAX_N of them) for the option NAME; returns how
 * many.  A bad list prints what NAME wants and exits 2.
 */
size_t bench_parse_list(const char *name, const char *list, size_t *out,
			size_t max_n, size_t min, size_t max, size_t mult);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t bench_now_ns(void);

/* One sample row: "BENCH,VARIANT,PARAM,METRIC,VALUE,UNIT" (%.10g value). */
void bench_sample(const char *bench, const char *variant, const char *param,
		  const char *metric, double value, const char *unit);

/* A "# ..." comment line (the '#' and newline are added). */
void bench_comment(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Print "# FAIL: ..." on stdout (and stderr when that is another file) and
 * exit(1): a correctness check of the benchmark did not hold. */
void bench_fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

/* Number of lines (= VMAs) in /proc/self/maps, or -1 with errno set. */
long bench_vma_count(void);

/* Write the string VAL to the file PATH (e.g. a /proc knob): 0 or -errno. */
int bench_write_file(const char *path, const char *val);
/* Read a decimal number from PATH into *VAL: 0 or -errno. */
int bench_read_long(const char *path, long *val);

#endif
