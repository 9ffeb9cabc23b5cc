// SPDX-License-Identifier: GPL-2.0
/*
 * workload.c: the versioned-record workload (workload.h).
 *
 * The arena holds 256-byte records.  Writer w owns every nw-th record and
 * rewrites them round-robin: update number s goes to its record
 * (s - 1) % R with seq_begin = s, a payload derived from (record, s), then
 * seq_end = s (release stores, so the order holds on weak memory too).
 * After each update the writer publishes done_seq = s in private memory.
 *
 * A copy of the arena taken at one instant therefore shows, per writer, the
 * R most recent updates up to some M (lo_w <= M <= hi_w + 1, done_seq read
 * just before and just after the snapshot instant; done_seq may lag the
 * last completed update by one), each record holding exactly
 * the seq its position implies, plus at most one record being written
 * (seq_begin = M + 1, seq_end = its previous seq, each payload word old or
 * new).  A copy that mixes instants breaks this record by record.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "workload.h"

/* Log-linear histogram: < 128 ns exact, then 64 steps per power of two. */
static unsigned int wl_bucket(uint64_t ns)
{
	int msb, shift;
	unsigned int b;

	if (ns < 128)
		return (unsigned int)ns;
	msb = 63 - __builtin_clzll(ns);
	shift = msb - 6;
	b = (unsigned int)(shift + 1) * 64 + (unsigned int)((ns >> shift) & 63);
	return b < WL_HBUCKETS ? b : WL_HBUCKETS - 1;
}

static uint64_t wl_bucket_ns(unsigned int b)
{
	if (b < 128)
		return b;
	return (uint64_t)(64 + b % 64) << (b / 64 - 1);
}

static void wl_update(struct wl *wl, struct wl_writer *me, uint64_t s)
{
	uint64_t k = (s - 1) % me->nrec, g = k * (uint64_t)wl->nw + me->id;
	struct wl_rec *r = &wl->arena[g];

	__atomic_store_n(&r->seq_begin, s, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	for (int i = 0; i < WL_WORDS; i++)
		__atomic_store_n(&r->payload[i], wl_word(g, s, i),
				 __ATOMIC_RELAXED);
	__atomic_store_n(&r->seq_end, s, __ATOMIC_RELEASE);
}

static void *wl_writer_main(void *arg)
{
	struct wl_writer *me = arg;
	struct wl *wl = me->wl;
	uint64_t s = atomic_load(&me->done_seq), s0 = s, start = wl_now_ns();

	while (!atomic_load_explicit(&wl->stop, memory_order_relaxed)) {
		uint64_t t0 = wl_now_ns(), d;

		/* A paced writer: no more than RATE_PER_MS updates per ms
		 * since it started (it catches up after a stall). */
		if (wl->rate_per_ms &&
		    (s - s0) >= (t0 - start) / 1000000 * wl->rate_per_ms) {
			sched_yield();
			continue;
		}

		wl_update(wl, me, ++s);
		atomic_store_explicit(&me->done_seq, s, memory_order_release);
		if (atomic_load_explicit(&wl->measure, memory_order_relaxed)) {
			d = wl_now_ns() - t0;
			me->hist[wl_bucket(d)]++;
			if (d > me->max_ns)
				me->max_ns = d;
		}
	}
	return NULL;
}

int wl_init(struct wl *wl, size_t size, int nw, bool thp)
{
	const size_t align = 2UL << 20;
	uintptr_t a;

	memset(wl, 0, sizeof(*wl));
	if (nw < 1 || size < 2 * (size_t)nw * sizeof(struct wl_rec) ||
	    size % 4096)
		return -EINVAL;
	wl->map_len = size + align;
	wl->map = mmap(NULL, wl->map_len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (wl->map == MAP_FAILED)
		return -errno;
	a = ((uintptr_t)wl->map + align - 1) & ~(align - 1);
	wl->arena = (struct wl_rec *)a;
	wl->len = size;
	madvise(wl->arena, size, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	wl->nrec = size / sizeof(struct wl_rec);
	wl->nw = nw;
	wl->w = calloc((size_t)nw, sizeof(*wl->w));
	if (!wl->w)
		return -ENOMEM;
	for (int w = 0; w < nw; w++) {
		struct wl_writer *me = &wl->w[w];

		me->wl = wl;
		me->id = (uint32_t)w;
		me->nrec = (wl->nrec - (uint64_t)w + (uint64_t)nw - 1) / (uint64_t)nw;
		for (uint64_t k = 0; k < me->nrec; k++) {
			struct wl_rec *r = wl_rec_of(wl, (uint32_t)w, k);

			r->writer = (uint32_t)w;
			r->idx = (uint32_t)k;
			wl_update(wl, me, k + 1);
		}
		me->done_seq = me->nrec;
	}
	return 0;
}

int wl_start(struct wl *wl)
{
	atomic_store(&wl->stop, 0);
	for (int w = 0; w < wl->nw; w++) {
		int err = pthread_create(&wl->w[w].thread, NULL, wl_writer_main,
					 &wl->w[w]);
		if (err) {
			atomic_store(&wl->stop, 1);
			while (w--)
				pthread_join(wl->w[w].thread, NULL);
			return -err;
		}
	}
	wl->running = true;
	return 0;
}

void wl_stop(struct wl *wl)
{
	atomic_store(&wl->stop, 1);
	if (!wl->running)
		return;
	for (int w = 0; w < wl->nw; w++)
		pthread_join(wl->w[w].thread, NULL);
	wl->running = false;
}

void wl_destroy(struct wl *wl)
{
	wl_stop(wl);
	if (wl->map && wl->map != MAP_FAILED)
		munmap(wl->map, wl->map_len);
	free(wl->w);
	memset(wl, 0, sizeof(*wl));
}

void wl_seqs(struct wl *wl, uint64_t *out)
{
	for (int w = 0; w < wl->nw; w++)
		out[w] = atomic_load_explicit(&wl->w[w].done_seq,
					      memory_order_acquire);
}

static void wl_measure(struct wl *wl, bool on)
{
	if (on)
		for (int w = 0; w < wl->nw; w++) {
			memset(wl->w[w].hist, 0, sizeof(wl->w[w].hist));
			wl->w[w].max_ns = 0;
		}
	atomic_store(&wl->measure, on);
}

/* Percentiles (in us) over every writer's histogram. */
static void wl_latency(struct wl *wl, struct wl_result *res)
{
	uint64_t total = 0, seen = 0, maxns = 0;
	double p50 = 0, p99 = 0;
	bool have50 = false;

	for (int w = 0; w < wl->nw; w++) {
		for (int b = 0; b < WL_HBUCKETS; b++)
			total += wl->w[w].hist[b];
		if (wl->w[w].max_ns > maxns)
			maxns = wl->w[w].max_ns;
	}
	for (int b = 0; b < WL_HBUCKETS && total; b++) {
		for (int w = 0; w < wl->nw; w++)
			seen += wl->w[w].hist[b];
		if (!have50 && seen * 2 >= total) {
			p50 = wl_bucket_ns((unsigned int)b) / 1000.0;
			have50 = true;
		}
		if (seen * 100 >= total * 99) {
			p99 = wl_bucket_ns((unsigned int)b) / 1000.0;
			break;
		}
	}
	res->p50_us = p50;
	res->p99_us = p99;
	res->max_us = maxns / 1000.0;
	res->updates = total;
}

bool wl_verify(struct wl *wl, const struct wl_rec *snap,
	       const uint64_t *lo, const uint64_t *hi,
	       struct wl_result *res)
{
	res->torn = 0;
	for (int w = 0; w < wl->nw; w++) {
		uint64_t R = wl->w[w].nrec, M = 0;
		bool any = false;

		for (uint64_t k = 0; k < R; k++) {
			const struct wl_rec *r = &snap[k * (uint64_t)wl->nw + w];

			if (r->seq_begin == r->seq_end && r->seq_end > M)
				M = r->seq_end;
			any |= r->seq_begin == r->seq_end;
		}
		/* M may be one past HI: the update completed just before the
		 * instant can still be unpublished when HI is read (after
		 * fork() the writer's store to done_seq faults on the
		 * copy-on-write page first). */
		if (!any || M < lo[w] || M > hi[w] + 1) {
			snprintf(res->why, sizeof(res->why),
				 "writer %d: snapshot at update %llu, outside [%llu, %llu] of the instant",
				 w, (unsigned long long)M,
				 (unsigned long long)lo[w], (unsigned long long)hi[w]);
			return false;
		}
		for (uint64_t k = 0; k < R; k++) {
			uint64_t g = k * (uint64_t)wl->nw + w;
			const struct wl_rec *r = &snap[g];
			/* The last update <= M that went to record k. */
			uint64_t exp = M >= k + 1 ? M - (M - (k + 1)) % R : 0;
			bool torn = r->seq_begin != r->seq_end;

			if (r->writer != (uint32_t)w || r->idx != k || !exp) {
				snprintf(res->why, sizeof(res->why),
					 "record %llu: bad header", (unsigned long long)g);
				return false;
			}
			if (torn && !(r->seq_begin == M + 1 && r->seq_end == exp &&
				      M % R == k)) {
				snprintf(res->why, sizeof(res->why),
					 "record %llu (writer %d): torn %llu/%llu, only update %llu may be in flight",
					 (unsigned long long)g, w,
					 (unsigned long long)r->seq_begin,
					 (unsigned long long)r->seq_end,
					 (unsigned long long)M + 1);
				return false;
			}
			if (!torn && r->seq_end != exp) {
				snprintf(res->why, sizeof(res->why),
					 "record %llu (writer %d): update %llu, the instant says %llu",
					 (unsigned long long)g, w,
					 (unsigned long long)r->seq_end,
					 (unsigned long long)exp);
				return false;
			}
			for (int i = 0; i < WL_WORDS; i++) {
				uint64_t v = r->payload[i];

				if (v == wl_word(g, exp, i) ||
				    (torn && v == wl_word(g, M + 1, i)))
					continue;
				snprintf(res->why, sizeof(res->why),
					 "record %llu word %d: payload of neither update %llu nor %llu",
					 (unsigned long long)g, i,
					 (unsigned long long)exp,
					 (unsigned long long)M + 1);
				return false;
			}
			res->torn += torn;
		}
	}
	return true;
}

static bool wl_verify_file(struct wl *wl, const char *path, const uint64_t *lo,
			   const uint64_t *hi, struct wl_result *res)
{
	struct stat st;
	void *p;
	bool ok;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || fstat(fd, &st) || (size_t)st.st_size != wl->len) {
		snprintf(res->why, sizeof(res->why), "%s: %s", path,
			 fd < 0 ? strerror(errno) : "size differs from the arena");
		if (fd >= 0)
			close(fd);
		return false;
	}
	p = mmap(NULL, wl->len, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		snprintf(res->why, sizeof(res->why), "mmap %s: %s", path,
			 strerror(errno));
		return false;
	}
	ok = wl_verify(wl, p, lo, hi, res);
	munmap(p, wl->len);
	return ok;
}

int wl_snap_fork(struct wl *wl, const char *path, struct wl_result *res)
{
	uint64_t lo[wl->nw], hi[wl->nw], t0, t1;
	struct rusage ru0, ru1;
	int fd, status;
	pid_t pid;

	memset(res, 0, sizeof(*res));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	wl_measure(wl, true);
	getrusage(RUSAGE_SELF, &ru0);
	wl_seqs(wl, lo);
	t0 = wl_now_ns();
	pid = fork();
	if (pid == 0) {
		const char *p = (const char *)wl->arena;
		size_t left = wl->len;

		while (left) {
			/* Same piece size as libuffdwp's fd sink. */
			ssize_t w = write(fd, p, left > WL_WRITE_MAX ? WL_WRITE_MAX : left);

			if (w <= 0)
				_exit(1);
			p += w;
			left -= (size_t)w;
		}
		_exit(0);
	}
	t1 = wl_now_ns();
	wl_seqs(wl, hi);
	close(fd);
	if (pid < 0) {
		wl_measure(wl, false);
		return -errno;
	}
	res->pause_us = (t1 - t0) / 1000.0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	res->total_ms = (wl_now_ns() - t0) / 1e6;
	wl_measure(wl, false);
	getrusage(RUSAGE_SELF, &ru1);
	/* Every minor fault of the parent meanwhile is a page copied on
	 * write; page tables of the child: one 8-byte entry per page. */
	res->extra_mib = ((double)(ru1.ru_minflt - ru0.ru_minflt) * 4096 +
			  wl->len / 512.0) / (1 << 20);
	wl_latency(wl, res);
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		snprintf(res->why, sizeof(res->why), "fork child failed to write %s", path);
		return 0;
	}
	res->verified = wl_verify_file(wl, path, lo, hi, res);
	return 0;
}

/*
 * Wait for snapshot S started at T0, printing a progress line to
 * wl->progress every wl->progress_ms and stopping the writers
 * wl->write_ms after T0 (then res->write_ms says how long they ran).
 */
static int wl_snap_wait(struct wl *wl, struct uffdwp_snapshot *s,
			uint64_t t0, struct wl_result *res)
{
	uint64_t next = wl->progress_ms ? wl->progress_ms : UINT64_MAX;
	struct uffdwp_snapshot_stats st;

	if (!wl->progress && !wl->write_ms)
		return uffdwp_snapshot_wait(s, -1);
	for (;;) {
		uint64_t ms = (wl_now_ns() - t0) / 1000000;
		uint64_t until = next;
		int err;

		if (wl->write_ms && wl->running && wl->write_ms < until)
			until = wl->write_ms;
		err = uffdwp_snapshot_wait(s, until > ms ?
					   (int)(until - ms < 1000000 ? until - ms : 1000000) : 0);
		if (err != -ETIMEDOUT)
			return err;
		ms = (wl_now_ns() - t0) / 1000000;
		if (wl->write_ms && wl->running && ms >= wl->write_ms) {
			wl_stop(wl);
			res->write_ms = (wl_now_ns() - t0) / 1e6;
			if (wl->progress)
				fprintf(wl->progress,
					"  %6.1f s: writers stopped (time bound %u ms); copier goes on alone\n",
					res->write_ms / 1000, wl->write_ms);
		}
		if (wl->progress && ms >= next) {
			uffdwp_snapshot_stats(s, &st);
			fprintf(wl->progress,
				"  %6.1f s: copied %llu/%llu pages, %llu write faults handled, side buffer peak %llu KiB\n",
				ms / 1000.0, (unsigned long long)st.pages_copied,
				(unsigned long long)st.pages,
				(unsigned long long)st.faults,
				(unsigned long long)(st.side_peak >> 10));
			while (next <= ms)
				next += wl->progress_ms;
		}
	}
}

/* RES from libuffdwp's stats ST, and the writers' latency. */
static void wl_take_stats(struct wl *wl,
			  const struct uffdwp_snapshot_stats *st,
			  struct wl_result *res)
{
	res->pause_us = st->pause_ns / 1000.0;
	/* A memfd spill is memory too; a spill into the sink file is not. */
	res->extra_mib = (double)(st->side_peak + st->spill_peak +
				  st->fixed_bytes) / (1 << 20);
	res->faults = st->faults;
	res->saved = st->saved;
	res->spilled = st->spilled;
	res->huge_blocks = st->huge_blocks;
	res->huge_saves = st->huge_saves;
	res->fault_max_us = st->fault_max_ns / 1000.0;
	wl_latency(wl, res);
}

int wl_snap_uffdwp(struct wl *wl, const char *path, size_t cap,
		   struct wl_result *res)
{
	uint64_t lo[wl->nw], hi[wl->nw], t0;
	struct uffdwp_region r = { wl->arena, wl->len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .side_cap = cap };
	struct uffdwp_snapshot_stats st;
	struct uffdwp_snapshot *s;
	int err;

	memset(res, 0, sizeof(*res));
	o.sink_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (o.sink_fd < 0)
		return -errno;
	wl_measure(wl, true);
	wl_seqs(wl, lo);
	t0 = wl_now_ns();
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	wl_seqs(wl, hi);
	if (err) {
		wl_measure(wl, false);
		close(o.sink_fd);
		return err;
	}
	err = wl_snap_wait(wl, s, t0, res);
	res->total_ms = (wl_now_ns() - t0) / 1e6;
	if (!res->write_ms)
		res->write_ms = res->total_ms;
	wl_measure(wl, false);
	uffdwp_snapshot_stats(s, &st);
	uffdwp_snapshot_free(s);
	close(o.sink_fd);
	wl_take_stats(wl, &st, res);
	if (err) {
		snprintf(res->why, sizeof(res->why), "snapshot failed: %s",
			 strerror(-err));
		return 0;
	}
	if (wl->progress)
		fprintf(wl->progress, "  %6.1f s: snapshot done, checking %llu records\n",
			res->total_ms / 1000, (unsigned long long)wl->nrec);
	res->verified = wl_verify_file(wl, path, lo, hi, res);
	return 0;
}

/* One session snapshot into FD: RES gets the pause, the total, the
 * writers' latency meanwhile and the library's stats; *PAGES the pages it
 * stores; LO and HI the writers' progress around the instant. */
static int wl_session_snap(struct wl *wl, struct uffdwp_session *ss,
			   int fd, struct wl_result *res,
			   uint64_t *pages, uint64_t *lo, uint64_t *hi)
{
	struct uffdwp_snapshot_stats st;
	uint64_t t0;
	int err;

	memset(res, 0, sizeof(*res));
	wl_measure(wl, true);
	wl_seqs(wl, lo);
	t0 = wl_now_ns();
	err = uffdwp_session_snapshot(ss, fd, 0);
	wl_seqs(wl, hi);
	if (!err)
		err = uffdwp_session_wait(ss, -1);
	res->total_ms = (wl_now_ns() - t0) / 1e6;
	res->write_ms = res->total_ms;
	wl_measure(wl, false);
	if (err)
		return err;
	uffdwp_session_stats(ss, &st);
	*pages = st.pages;
	wl_take_stats(wl, &st, res);
	return 0;
}

/* Apply the snapshot file FD (from offset 0) to IMAGE, after PREV. */
static int wl_load(int fd, void *image, size_t len,
		   const struct uffdwp_snapshot_info *prev,
		   struct uffdwp_snapshot_info *info)
{
	struct uffdwp_region dst = { image, len };

	if (lseek(fd, 0, SEEK_SET) < 0)
		return -errno;
	return uffdwp_snapshot_load(fd, &dst, 1, prev, info);
}

int wl_snap_precopy(struct wl *wl, const char *path,
		    struct wl_result *res,
		    struct uffdwp_snapshot_stats *st)
{
	uint64_t lo[wl->nw], hi[wl->nw], t0;
	struct uffdwp_region r = { wl->arena, wl->len };
	struct uffdwp_session *ss = NULL;
	struct uffdwp_snapshot_info info;
	void *image;
	int fd, err;

	memset(res, 0, sizeof(*res));
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	image = mmap(NULL, wl->len, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	err = image == MAP_FAILED ? -ENOMEM :
	      uffdwp_session_new(&ss, &r, 1, NULL);
	wl_measure(wl, true);
	wl_seqs(wl, lo);
	t0 = wl_now_ns();
	if (!err)
		err = uffdwp_session_precopy(ss, fd, NULL);
	wl_seqs(wl, hi);
	if (!err)
		err = uffdwp_session_wait(ss, -1);
	res->total_ms = (wl_now_ns() - t0) / 1e6;
	res->write_ms = res->total_ms;
	wl_measure(wl, false);
	if (!err)
		err = uffdwp_session_stats(ss, st);
	if (!err)
		wl_take_stats(wl, st, res);
	if (!err)
		err = wl_load(fd, image, wl->len, NULL, &info);
	if (!err)
		res->verified = wl_verify(wl, image, lo, hi, res);
	uffdwp_session_free(ss);
	if (image != MAP_FAILED)
		munmap(image, wl->len);
	close(fd);
	if (err)
		snprintf(res->why, sizeof(res->why), "pre-copy failed: %s",
			 strerror(-err));
	return err;
}

int wl_snap_session(struct wl *wl, const char *base_path,
		    const char *delta_path, unsigned int permille,
		    struct wl_result *base, struct wl_result *delta,
		    uint64_t *delta_pages)
{
	uint64_t lo[wl->nw], hi[wl->nw], pages0 = 0;
	struct uffdwp_region r = { wl->arena, wl->len };
	struct uffdwp_snapshot_info ib, is, id;
	struct uffdwp_session *ss = NULL;
	struct wl_result settle;
	size_t pages = wl->len / (size_t)sysconf(_SC_PAGESIZE);
	ssize_t want = (ssize_t)(pages * permille / 1000);
	int fd[3], err;
	void *image;

	memset(base, 0, sizeof(*base));
	memset(delta, 0, sizeof(*delta));
	fd[0] = open(base_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	fd[1] = memfd_create("wl-settle", MFD_CLOEXEC);
	fd[2] = open(delta_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	image = mmap(NULL, wl->len, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	err = fd[0] < 0 || fd[1] < 0 || fd[2] < 0 ? -errno :
	      image == MAP_FAILED ? -ENOMEM : 0;
	if (!err)
		err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = wl_session_snap(wl, ss, fd[0], base, &pages0, lo, hi);
	if (!err)
		err = wl_load(fd[0], image, wl->len, NULL, &ib);
	if (!err)
		base->verified = wl_verify(wl, image, lo, hi, base);
	wl_stop(wl);
	if (!err)
		err = wl_session_snap(wl, ss, fd[1], &settle, &pages0, lo, hi);
	if (!err)
		err = wl_load(fd[1], image, wl->len, &ib, &is);
	/* Dirty the wanted share (at most a minute).  No sleep: a timer
	 * tick under TCG lets the writers run far past it. */
	if (!err)
		err = wl_start(wl);
	for (uint64_t t = wl_now_ns(); !err && uffdwp_session_dirty(ss) < want &&
	     wl_now_ns() - t < 60000000000ull;)
		sched_yield();
	wl_stop(wl);
	if (!err)
		err = wl_session_snap(wl, ss, fd[2], delta, delta_pages, lo, hi);
	if (!err)
		err = wl_load(fd[2], image, wl->len, &is, &id);
	if (!err)
		delta->verified = wl_verify(wl, image, lo, hi, delta);
	uffdwp_session_free(ss);
	if (image != MAP_FAILED)
		munmap(image, wl->len);
	for (int i = 0; i < 3; i++)
		if (fd[i] >= 0)
			close(fd[i]);
	if (err)
		snprintf(delta->why, sizeof(delta->why), "session failed: %s",
			 strerror(-err));
	return err;
}
