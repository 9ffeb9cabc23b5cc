// SPDX-License-Identifier: GPL-2.0
/*
 * bench-snapshot: a live snapshot of a busy arena, by fork() and by
 * libuffdwp.
 *
 * Workload (workload/workload.h): writer threads keep rewriting versioned
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
 *                   the arena); uffdwp: side buffer high-water mark + chunk
 *                   buffer + page states
 *   total_ms        start of the snapshot to the file complete
 *   verified        1 if the file is the arena at one instant
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static int run_case(size_t mib, bool thp, int reps)
{
	char param[64];
	struct wl wl;
	int bad = 0, err;

	snprintf(param, sizeof(param), "size_mib=%zu;thp=%s", mib, thp ? "on" : "off");
	err = wl_init(&wl, mib << 20, WRITERS, thp);
	if (!err)
		err = wl_start(&wl);
	if (err) {
		fprintf(stderr, "bench-snapshot: %s: arena: %s\n", param, strerror(-err));
		wl_destroy(&wl);
		return 1;
	}
	printf("# %s: arena AnonHugePages %s\n", param, thp ? "asked (MADV_HUGEPAGE)" : "refused (MADV_NOHUGEPAGE)");
	fflush(stdout);
	for (int rep = 0; rep < reps; rep++) {
		for (int v = 0; v < 2; v++) {
			const char *variant = v ? "uffdwp" : "fork";
			struct wl_result res;

			usleep(20000);
			err = v ? wl_snap_uffdwp(&wl, SNAP_PATH, SIDE_CAP, &res)
				: wl_snap_fork(&wl, SNAP_PATH, &res);
			unlink(SNAP_PATH);
			if (err) {
				fprintf(stderr, "bench-snapshot: %s %s: %s\n",
					variant, param, strerror(-err));
				bad = 1;
				continue;
			}
			row(variant, param, "pause_us", res.pause_us, "us");
			row(variant, param, "writer_p50_us", res.p50_us, "us");
			row(variant, param, "writer_p99_us", res.p99_us, "us");
			row(variant, param, "writer_max_us", res.max_us, "us");
			row(variant, param, "peak_extra_mib", res.extra_mib, "MiB");
			row(variant, param, "total_ms", res.total_ms, "ms");
			row(variant, param, "verified", res.verified, "bool");
			if (!res.verified) {
				fprintf(stderr, "bench-snapshot: %s %s rep %d NOT VERIFIED: %s\n",
					variant, param, rep, res.why);
				bad = 1;
			}
			fflush(stdout);
		}
	}
	wl_stop(&wl);
	wl_destroy(&wl);
	return bad;
}

int main(int argc, char **argv)
{
	int reps = 5, reps_big = 2, bad = 0;
	bool quick = false, reps_set = false;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick")) {
			quick = true;
		} else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			char *end;
			long v = strtol(argv[++i], &end, 10);

			if (*end || v < 1 || v > 1000) {
				fprintf(stderr, "bench-snapshot: bad --reps '%s'\n", argv[i]);
				return 2;
			}
			reps = reps_big = (int)v;
			reps_set = true;
		} else {
			fprintf(stderr, "bench-snapshot: unknown argument '%s'\n"
				"usage: bench-snapshot [--quick] [--reps N]\n", argv[i]);
			return 2;
		}
	}
	printf("# snapshot of a busy arena: fork() (child writes the arena to a file) vs libuffdwp (fd sink)\n");
	printf("# %d writer thread(s) rewriting 256-byte versioned records; file in /tmp; side buffer cap %lu MiB\n",
	       WRITERS, SIDE_CAP >> 20);
	printf("# every repetition is verified record by record against the snapshot instant\n");
	if (quick) {
		printf("# --quick: 16 MiB arena, THP off, 1 repetition\n");
		bad |= run_case(16, false, 1);
		return bad;
	}
	if (!reps_set)
		printf("# repetitions: %d for 256 MiB, %d for 1 GiB (a 1 GiB snapshot + check takes ~1 min in TCG)\n",
		       reps, reps_big);
	bad |= run_case(256, false, reps);
	bad |= run_case(256, true, reps);
	bad |= run_case(1024, false, reps_big);
	bad |= run_case(1024, true, reps_big);
	return bad;
}
