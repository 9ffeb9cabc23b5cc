// SPDX-License-Identifier: GPL-2.0
/*
 * bench-snapshot: a live snapshot of a busy arena, by fork() and by
 * libuffdwp.
 *
 * Workload (workload/workload.c): writer threads keep rewriting versioned
 * 256-byte records spread over the arena.  Each repetition snapshots the
 * arena to a file in /tmp, either by fork() (the child writes the arena out
 * while copy-on-write keeps its view frozen) or by uffdwp_snapshot_start()
 * with an fd sink, then checks the file record by record against the
 * snapshot instant; a failed check makes the program exit 1.
 *
 * Metrics per repetition:
 *   pause_us        fork: the fork() call (writers that fault wait for it);
 *                   uffdwp: the protect phase (the snapshot instant)
 *   writer_p50/p99/max_us  latency of one record update while the snapshot
 *                   runs (start to file complete), over all writers
 *   peak_extra_mib  fork: pages copied on write in the parent (its minor
 *                   faults meanwhile) + the child's page tables (1/512 of
 *                   the arena); uffdwp: side buffer high-water mark + memfd
 *                   spill high-water mark (0 here: a file sink takes spilled
 *                   pages at their offsets) + chunk buffer + page states
 *
 * Variants: fork; uffdwp (16 MiB side buffer cap); uffdwp_cap1m (1 MiB);
 * uffdwp_delta: a session's base (writer running); a first delta of what
 * the writer wrote while the base was copied; then the writer dirties 1%
 * (--delta-pct) of the pages at random and stops, and the measured delta is taken (its writer
 * metrics are 0: nothing writes during it); its rows are the delta's, plus
 * base_pause_us, base_total_ms, pause_vs_base and total_vs_base (the
 * delta's cost over the base's, same repetition) and delta_pages_pct.
 * uffdwp_precopy: a session's base with pre-copy
 * (uffdwp_session_precopy()) while the writer is paced at PRECOPY_RATE
 * updates per ms, the same at every arena size; its pause is the
 * instant's; rows precopy_rounds, precopy_pages_pct (what the rounds
 * wrote), instant_pages_pct (what the instant protected),
 * instant_switch_us and instant_harvest_us (the instant's UFFDIO_SET_MODE
 * and its ring harvest with the reset that protects the pages; the rest
 * of the pause is the set's bitmap pass and protect calls) and
 * fork_pause_over_pause (fork's pause in the same repetition over this
 * one's, when fork ran).
 * Options: --quick, --reps N, --sizes MIB[,MIB...] (default 256,1024),
 * --thp on|off|both (default both), --variants NAME[,NAME...] (default
 * all), --delta-pct P[,P...] (uffdwp_delta's shares written, 1-50 %;
 * default 1).
 *   fault_max_us    uffdwp only: the longest the library's handler took
 *                   for one fault (claim, save, unprotect); the rest of a
 *                   writer's worst wait is the protect phase and being
 *                   woken and scheduled
 *   total_ms        start of the snapshot to the file complete
 *   verified        1 if the file is the arena at one instant
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "uffdwp.h"
#include "workload.h"

#define WRITERS		1
#define SNAP_PATH	"/tmp/bench-snapshot.snap"
#define SIDE_CAP	(16UL << 20)

static void row(const char *variant, const char *param, const char *metric,
		double v, const char *unit)
{
	printf("snapshot,%s,%s,%s,%.3f,%s\n", variant, param, metric, v, unit);
}

#define DELTA_PATH	"/tmp/bench-snapshot.delta"
/* --delta-pct: the shares of pages the delta's writer dirties, in % (the
 * default 1% keeps the plain param label; others add ";delta_pct=N"). */
static size_t delta_pct[8] = { 1 }, ndelta_pct = 1;
/* uffdwp_precopy's writer: this many record updates per ms, whatever the
 * arena's size (16 records to a page: about 500 pages a second). */
#define PRECOPY_RATE	8

/* The variants, in the order each repetition runs them. */
static const struct variant {
	const char *name;
	enum { FORK, ONE_OFF, DELTA, PRECOPY } kind;
	size_t cap;
} variants[] = {
	{ "fork", FORK, 0 },
	{ "uffdwp", ONE_OFF, SIDE_CAP },
	{ "uffdwp_cap1m", ONE_OFF, 1UL << 20 },
	{ "uffdwp_delta", DELTA, SIDE_CAP },
	{ "uffdwp_precopy", PRECOPY, SIDE_CAP },
};

/* fork's pause in the current repetition (0: fork did not run). */
static double fork_pause_us;

/* libuffdwp's measurement seam (lib/precopy.c, static builds only): the
 * last pre-copy instant's switch to sync mode and its ring harvest. */
extern uint64_t uw_precopy_switch_ns, uw_precopy_harvest_ns;

/* uffdwp_precopy: its rows beside the common ones. */
static int run_precopy(struct wl *wl, const char *param, int rep,
		       struct wl_result *res)
{
	struct uffdwp_snapshot_stats st = { 0 };
	double pages = (double)(wl->len / (size_t)sysconf(_SC_PAGESIZE));
	int err = wl_snap_precopy(wl, SNAP_PATH, res, &st);

	if (err)
		return err;
	row("uffdwp_precopy", param, "precopy_rounds",
	    (double)st.precopy_rounds, "count");
	row("uffdwp_precopy", param, "precopy_pages_pct",
	    100.0 * (double)st.precopy_pages / pages, "pct");
	row("uffdwp_precopy", param, "instant_pages_pct",
	    100.0 * (double)st.pages_copied / pages, "pct");
	row("uffdwp_precopy", param, "instant_switch_us",
	    uw_precopy_switch_ns / 1000.0, "us");
	row("uffdwp_precopy", param, "instant_harvest_us",
	    uw_precopy_harvest_ns / 1000.0, "us");
	if (fork_pause_us > 0)
		row("uffdwp_precopy", param, "fork_pause_over_pause",
		    res->pause_us > 0 ? fork_pause_us / res->pause_us : 0,
		    "ratio");
	printf("# uffdwp_precopy %s rep %d: writer paced at %d updates/ms; %llu rounds wrote %llu pages, the instant protected %llu\n",
	       param, rep, PRECOPY_RATE, (unsigned long long)st.precopy_rounds,
	       (unsigned long long)st.precopy_pages,
	       (unsigned long long)st.pages_copied);
	return 0;
}

/* uffdwp_delta: the delta's rows and how it compares with its base. */
static int run_delta(struct wl *wl, const char *param, size_t pct, int rep,
		     struct wl_result *res)
{
	struct wl_result base;
	uint64_t pages = 0;
	int err = wl_snap_session(wl, SNAP_PATH, DELTA_PATH,
				  (unsigned int)pct * 10, &base, res, &pages);

	unlink(DELTA_PATH);
	if (err)
		return err;
	row("uffdwp_delta", param, "base_pause_us", base.pause_us, "us");
	row("uffdwp_delta", param, "base_total_ms", base.total_ms, "ms");
	row("uffdwp_delta", param, "pause_vs_base",
	    base.pause_us > 0 ? res->pause_us / base.pause_us : 0, "ratio");
	row("uffdwp_delta", param, "total_vs_base",
	    base.total_ms > 0 ? res->total_ms / base.total_ms : 0, "ratio");
	row("uffdwp_delta", param, "delta_pages_pct",
	    100.0 * (double)pages / (double)(wl->len / (size_t)sysconf(_SC_PAGESIZE)),
	    "pct");
	if (!base.verified) {
		res->verified = false;
		memcpy(res->why, base.why, sizeof(res->why));
	}
	printf("# uffdwp_delta %s rep %d: base pause %.1f us total %.1f ms; delta of %llu pages\n",
	       param, rep, base.pause_us, base.total_ms, (unsigned long long)pages);
	return 0;
}

static void report(const char *variant, const char *param, int rep,
		   const struct wl_result *res)
{
	row(variant, param, "pause_us", res->pause_us, "us");
	row(variant, param, "writer_p50_us", res->p50_us, "us");
	row(variant, param, "writer_p99_us", res->p99_us, "us");
	row(variant, param, "writer_max_us", res->max_us, "us");
	row(variant, param, "peak_extra_mib", res->extra_mib, "MiB");
	row(variant, param, "total_ms", res->total_ms, "ms");
	row(variant, param, "verified", res->verified, "bool");
	if (strcmp(variant, "fork")) {
		row(variant, param, "fault_max_us", res->fault_max_us, "us");
		printf("# %s %s rep %d: %llu faults, %llu pages saved, %llu spilled, %llu huge blocks at the start, %llu saved whole\n",
		       variant, param, rep, (unsigned long long)res->faults,
		       (unsigned long long)res->saved,
		       (unsigned long long)res->spilled,
		       (unsigned long long)res->huge_blocks,
		       (unsigned long long)res->huge_saves);
	}
}

/*
 * Every variant of every repetition runs on a freshly populated arena:
 * fork's copy-on-write splits huge pages, so a shared arena would hand the
 * next variant split memory and "thp=on" would not measure huge pages.
 */
#define NVARIANTS (sizeof(variants) / sizeof(variants[0]))

/* --variants: which variants run. */
static bool use[NVARIANTS];

/* --variants NAME[,NAME...] (LIST; NULL: all of them) into use[]; false on
 * an unknown name. */
static bool pick_variants(const char *list)
{
	memset(use, !list, sizeof(use));
	for (const char *p = list; p && *p;) {
		size_t n = strcspn(p, ","), v = 0;

		while (v < NVARIANTS && (strlen(variants[v].name) != n ||
					 strncmp(variants[v].name, p, n)))
			v++;
		if (v == NVARIANTS) {
			fprintf(stderr, "bench-snapshot: --variants: unknown variant '%.*s' (fork, uffdwp, uffdwp_cap1m, uffdwp_delta, uffdwp_precopy)\n",
				(int)n, p);
			return false;
		}
		use[v] = true;
		p += n + (p[n] == ',');
	}
	return true;
}

/* One variant's repetition on a freshly populated arena; 1 if it failed. */
static int run_one(const struct variant *var, size_t mib, bool thp,
		   const char *case_param, size_t pct, int rep)
{
	char param[96];
	struct wl_result res;
	struct wl wl;
	int err;

	snprintf(param, sizeof(param), "%s", case_param);
	if (var->kind == DELTA && pct != 1)
		snprintf(param, sizeof(param), "%s;delta_pct=%zu", case_param,
			 pct);
	err = wl_init(&wl, mib << 20, WRITERS, thp);
	if (var->kind == PRECOPY)
		wl.rate_per_ms = PRECOPY_RATE;
	if (!err)
		err = wl_start(&wl);
	if (!err) {
		usleep(20000);
		err = var->kind == FORK ?
		      wl_snap_fork(&wl, SNAP_PATH, &res) :
		      var->kind == ONE_OFF ?
		      wl_snap_uffdwp(&wl, SNAP_PATH, var->cap, &res) :
		      var->kind == DELTA ?
		      run_delta(&wl, param, pct, rep, &res) :
		      run_precopy(&wl, param, rep, &res);
	}
	if (!err && var->kind == FORK)
		fork_pause_us = res.pause_us;
	unlink(SNAP_PATH);
	wl_destroy(&wl);
	if (err) {
		fprintf(stderr, "bench-snapshot: %s %s: %s\n", var->name, param,
			strerror(-err));
		return 1;
	}
	report(var->name, param, rep, &res);
	fflush(stdout);
	if (!res.verified) {
		fprintf(stderr, "bench-snapshot: %s %s rep %d NOT VERIFIED: %s\n",
			var->name, param, rep, res.why);
		return 1;
	}
	return 0;
}

static int run_case(size_t mib, bool thp, int reps)
{
	char param[64];
	int bad = 0;

	snprintf(param, sizeof(param), "size_mib=%zu;thp=%s", mib, thp ? "on" : "off");
	printf("# %s: arena AnonHugePages %s, populated afresh for each variant\n",
	       param, thp ? "asked (MADV_HUGEPAGE)" : "refused (MADV_NOHUGEPAGE)");
	fflush(stdout);
	for (int rep = 0; rep < reps; rep++) {
		fork_pause_us = 0;
		for (size_t v = 0; v < NVARIANTS; v++) {
			/* the delta runs once per --delta-pct share */
			size_t nruns = variants[v].kind == DELTA ? ndelta_pct : 1;

			for (size_t d = 0; use[v] && d < nruns; d++)
				bad |= run_one(&variants[v], mib, thp, param,
					       delta_pct[d], rep);
		}
	}
	return bad;
}

int main(int argc, char **argv)
{
	const char *sizes_opt = bench_take_opt(&argc, argv, "--sizes");
	const char *thp_opt = bench_take_opt(&argc, argv, "--thp");
	const char *variants_opt = bench_take_opt(&argc, argv, "--variants");
	const char *delta_opt = bench_take_opt(&argc, argv, "--delta-pct");
	size_t sizes[8] = { 256, 1024 }, nsizes = 2;
	bool thp_off = true, thp_on = true;
	struct bench_opts o;
	int bad = 0;

	bench_parse_args(argc, argv, &o, 5);
	if (!pick_variants(variants_opt))
		return 2;
	if (sizes_opt)
		nsizes = bench_parse_list("--sizes", sizes_opt, sizes, 8, 16,
					  4096, 2);
	if (delta_opt)
		ndelta_pct = bench_parse_list("--delta-pct", delta_opt,
					      delta_pct, 8, 1, 50, 1);
	if (thp_opt && !strcmp(thp_opt, "off"))
		thp_on = false;
	else if (thp_opt && !strcmp(thp_opt, "on"))
		thp_off = false;
	else if (thp_opt && strcmp(thp_opt, "both")) {
		fprintf(stderr, "bench-snapshot: --thp wants on, off or both, not '%s'\n",
			thp_opt);
		return 2;
	}
	printf("# snapshot of a busy arena: fork() (child writes the arena to a file) vs libuffdwp (fd sink)\n");
	printf("# %d writer thread(s) rewriting 256-byte versioned records; file in /tmp; side buffer cap %lu MiB (uffdwp), 1 MiB (uffdwp_cap1m)\n",
	       WRITERS, SIDE_CAP >> 20);
	printf("# every repetition is verified record by record against the snapshot instant\n");
	if (o.quick) {
		printf("# --quick: 16 MiB arena, THP off, 1 repetition\n");
		return run_case(16, false, 1);
	}
	if (!o.reps_set)
		printf("# repetitions: %d up to 256 MiB, 2 above (a 1 GiB snapshot + check takes ~1 min in TCG)\n",
		       o.reps);
	for (size_t i = 0; i < nsizes; i++) {
		int reps = o.reps_set || sizes[i] <= 256 ? o.reps : 2;

		if (thp_off)
			bad |= run_case(sizes[i], false, reps);
		if (thp_on)
			bad |= run_case(sizes[i], true, reps);
	}
	return bad;
}
