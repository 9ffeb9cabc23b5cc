/* SPDX-License-Identifier: GPL-2.0 */
/*
 * workload.h: the versioned-record workload shared by `uffdwp demo`,
 * bench-snapshot and the library's tests (workload/workload.c).
 *
 * Writer threads keep rewriting 256-byte records of an arena; a snapshot
 * of it (by fork, by libuffdwp, by a pre-copied session and its delta) is
 * read back and checked record by record against the writers' progress
 * around its instant (wl_verify()): a copy that mixes instants fails.  Why
 * that check holds: the top of workload.c.
 */
#ifndef UFFDWP_BENCH_WORKLOAD_H
#define UFFDWP_BENCH_WORKLOAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "uffdwp.h"

#define WL_WORDS	29
#define WL_HBUCKETS	2560
#define WL_WRITE_MAX	(16u << 10)	/* write(2) piece, as libuffdwp's */

struct wl_rec {
	uint64_t seq_begin;
	uint32_t writer, idx;
	uint64_t payload[WL_WORDS];
	uint64_t seq_end;
};
_Static_assert(sizeof(struct wl_rec) == 256, "record size");

struct wl;
struct wl_writer {
	pthread_t thread;
	struct wl *wl;
	uint32_t id;
	uint64_t nrec;
	_Atomic uint64_t done_seq;
	uint64_t hist[WL_HBUCKETS];	/* update latency, log-linear ns */
	uint64_t max_ns;
};

struct wl {
	struct wl_rec *arena;
	size_t len, map_len;
	void *map;
	uint64_t nrec;
	int nw;
	bool running;			/* writer threads started, not joined */
	atomic_int stop;
	atomic_int measure;
	struct wl_writer *w;
	/* Options of wl_snap_uffdwp() (0/NULL after wl_init: none). */
	FILE *progress;			/* a line every progress_ms */
	unsigned int progress_ms;
	unsigned int write_ms;		/* stop the writers this long after
					   the snapshot instant (0: never) */
	unsigned int rate_per_ms;	/* each writer's updates per ms
					   (0: as fast as it can) */
};

struct wl_result {
	double pause_us, p50_us, p99_us, max_us, extra_mib, total_ms;
	double write_ms;		/* writers ran this long during it */
	bool verified;
	uint64_t faults, saved, torn, updates;
	uint64_t spilled, huge_blocks, huge_saves;	/* libuffdwp's stats */
	double fault_max_us;
	char why[256];
};

static inline uint64_t wl_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t wl_word(uint64_t g, uint64_t s, int i)
{
	uint64_t x = (g << 32 | (uint64_t)i) ^ (s * 0x9E3779B97F4A7C15ull);

	x ^= x >> 29;
	return x * 0xBF58476D1CE4E5B9ull;
}

static inline struct wl_rec *wl_rec_of(struct wl *wl, uint32_t w, uint64_t k)
{
	return &wl->arena[k * (uint64_t)wl->nw + w];
}

/* Map and fill the arena (SIZE bytes, THP asked for or refused). */
int wl_init(struct wl *wl, size_t size, int nw, bool thp);

/* Start the writer threads. */
int wl_start(struct wl *wl);

/* Stop and join the writers; a no-op once they are stopped. */
void wl_stop(struct wl *wl);

/* Stop the writers, unmap the arena, free what wl_init() took. */
void wl_destroy(struct wl *wl);

/* Each writer's last published update (OUT[nw]), read with acquire. */
void wl_seqs(struct wl *wl, uint64_t *out);

/* Check SNAP (a copy of the arena) against the instant bounds. */
bool wl_verify(struct wl *wl, const struct wl_rec *snap,
	       const uint64_t *lo, const uint64_t *hi,
	       struct wl_result *res);

/* Snapshot with fork(): the child writes the arena to PATH. */
int wl_snap_fork(struct wl *wl, const char *path, struct wl_result *res);

/* Snapshot with libuffdwp into PATH; CAP is the side buffer cap. */
int wl_snap_uffdwp(struct wl *wl, const char *path, size_t cap,
		   struct wl_result *res);

/*
 * A libuffdwp session's base taken with pre-copy into PATH (a regular
 * file) while the writers run: RES as for any snapshot (the pause is the
 * instant's), plus the library's stats in *ST; the file is loaded back and
 * checked against the instant (RES->verified).
 */
int wl_snap_precopy(struct wl *wl, const char *path,
		    struct wl_result *res,
		    struct uffdwp_snapshot_stats *st);

/*
 * A libuffdwp session on the running workload: a base into BASE_PATH
 * (writers running), then the writers stop and a first delta takes what
 * they wrote while the base was copied (into a memfd); then they run again
 * until they have dirtied PERMILLE/1000 of the pages, stop, and the
 * measured delta goes into DELTA_PATH.  The files are loaded back into a
 * copy of the arena and checked against their instants (BASE->verified,
 * DELTA->verified).  *DELTA_PAGES: the pages the measured delta stores.
 */
int wl_snap_session(struct wl *wl, const char *base_path,
		    const char *delta_path, unsigned int permille,
		    struct wl_result *base, struct wl_result *delta,
		    uint64_t *delta_pages);

#endif
