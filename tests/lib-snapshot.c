// SPDX-License-Identifier: GPL-2.0
/*
 * lib-snapshot: libuffdwp snapshots.
 *  - the sink receives the regions' bytes in address order, whatever the
 *    order the regions were given in, to a callback or an fd;
 *  - under concurrent writers the copy is the memory at one instant
 *    (workload/workload.c's record check), and that check rejects a copy that
 *    mixes two instants;
 *  - writes to pages the copier has not reached yet leave the old contents
 *    in the snapshot and the new ones in memory, with the side buffer never
 *    above its cap (further pages spill);
 *  - no writer waits for the copier: with the copier held before its first
 *    chunk and a one-page cap, a writer rewrites every page, for a callback,
 *    a pipe (memfd spill) and a regular file sink (spilled into the file at
 *    each page's offset, position left at the end); a spill that fails
 *    (RLIMIT_FSIZE) fails the snapshot and lets the writer go;
 *  - a write into a PMD-mapped THP saves its whole 2 MiB block and keeps
 *    it PMD-mapped;
 *  - never-touched memory snapshots as zeroes, with and without
 *    WP_UNPOPULATED; THP-backed memory snapshots exactly;
 *  - cancel and a failing sink stop the snapshot and release every writer;
 *  - a page discarded (MADV_DONTNEED) before the copier reached it fails
 *    the snapshot with -EAGAIN instead of storing zeroes it never held;
 *  - the fd sink writes in pieces of at most 16 KiB (a 2 MiB write(2) into
 *    tmpfs took seconds in the riscv64 guest);
 *  - the workload's time-bounded writer phase still gives a verified copy;
 *  - bad input is -EINVAL / -EBUSY;
 *  - uffdwp_snapshot_fd() is readable exactly once the snapshot finished
 *    (copied or cancelled), and uffdwp_snapshot_stats_v() agrees with
 *    uffdwp_snapshot_stats().
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "lib_test.h"
#include "uffd_util.h"
#include "uffdwp.h"
#include "workload.h"

static long psz;

/* A sink callback that copies into BUF at the region offset, checking the
 * order: each call must start where the previous one ended or later. */
struct collect {
	char *buf;
	const struct uffdwp_region *r;
	int nr;
	uintptr_t last;
	int order_errors;
	int calls;
	int fail_at;		/* return -EIO on this call (1-based) */
	int delay_us;		/* sleep per call */
	pthread_mutex_t lock;
	pthread_cond_t cond;
};

static int collect_fn(void *arg, const void *addr, const void *data, size_t len)
{
	struct collect *c = arg;
	uintptr_t a = (uintptr_t)addr;
	size_t off = 0;

	if (a < c->last)
		c->order_errors++;
	c->last = a + len;
	for (int i = 0; i < c->nr; i++) {
		uintptr_t s = (uintptr_t)c->r[i].addr;

		if (a >= s && a + len <= s + c->r[i].len) {
			memcpy(c->buf + off + (a - s), data, len);
			break;
		}
		off += c->r[i].len;
	}
	pthread_mutex_lock(&c->lock);
	c->calls++;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	if (c->delay_us)
		usleep(c->delay_us);
	return c->calls == c->fail_at ? -EIO : 0;
}

static void collect_init(struct collect *c, char *buf,
			 const struct uffdwp_region *r, int nr)
{
	memset(c, 0, sizeof(*c));
	c->buf = buf;
	c->r = r;
	c->nr = nr;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
}

static char *map(size_t len, bool thp)
{
	size_t al = 2UL << 20;
	char *p = mmap(NULL, len + al, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	p = (char *)(((uintptr_t)p + al - 1) & ~(al - 1));
	madvise(p, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	return p;
}

/* snapshot-static / snapshot-fd: no writers, two regions given backwards. */
static void t_static(void)
{
	size_t len = 40 * psz;
	char *a = map(len, false), *b = map(len, false);
	char *buf = malloc(2 * len), *expect = malloc(2 * len);
	struct uffdwp_region r[2] = { { b, len }, { a, len } };
	struct uffdwp_region sorted[2];
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn };
	struct uffdwp_snapshot *s;
	struct collect c;
	int err, fd;

	if (skip_no_wp("snapshot-static") | skip_no_wp("snapshot-fd"))
		return;
	fill(a, len, 1);
	fill(b, len, 2);
	sorted[0] = a < b ? r[1] : r[0];
	sorted[1] = a < b ? r[0] : r[1];
	memcpy(expect, sorted[0].addr, len);
	memcpy(expect + len, sorted[1].addr, len);
	collect_init(&c, buf, sorted, 2);
	o.sink_arg = &c;
	err = uffdwp_snapshot_start(&s, r, 2, &o);
	if (!err)
		err = uffdwp_snapshot_wait(s, 60000);
	uffdwp_snapshot_free(s);
	tap_check(!err && !c.order_errors && !memcmp(buf, expect, 2 * len),
		  "snapshot-static", "err %d, %d out-of-order calls, data %s",
		  err, c.order_errors,
		  memcmp(buf, expect, 2 * len) ? "differs" : "same");

	fd = memfd_create("snap", MFD_CLOEXEC);
	o.sink = NULL;
	o.sink_fd = fd;
	err = fd < 0 ? -errno : uffdwp_snapshot_start(&s, r, 2, &o);
	if (!err)
		err = uffdwp_snapshot_wait(s, 60000);
	if (!err)
		uffdwp_snapshot_free(s);
	memset(buf, 0, 2 * len);
	if (!err && pread(fd, buf, 2 * len, 0) != (ssize_t)(2 * len))
		err = -EIO;
	tap_check(!err && !memcmp(buf, expect, 2 * len) &&
		  lseek(fd, 0, SEEK_END) == (off_t)(2 * len), "snapshot-fd",
		  "err %d, file data %s", err,
		  memcmp(buf, expect, 2 * len) ? "differs" : "same");
	if (fd >= 0)
		close(fd);
	free(buf);
	free(expect);
}

/* Snapshot of the record workload to a memfd, checked against the instant. */
static void t_concurrent(void)
{
	struct wl wl;
	struct wl_result res;
	char path[64];
	int err, fd;

	if (skip_no_wp("snapshot-concurrent"))
		return;
	fd = memfd_create("wl", MFD_CLOEXEC);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	err = wl_init(&wl, 16UL << 20, 2, false);
	if (!err)
		err = wl_start(&wl);
	if (!err) {
		usleep(20000);
		err = wl_snap_uffdwp(&wl, path, 1UL << 20, &res);
		wl_stop(&wl);
	}
	tap_check(!err && res.verified && res.updates > 0, "snapshot-concurrent",
		  "err %d, %s (%llu updates during the snapshot)", err,
		  res.why, (unsigned long long)res.updates);
	tap_diag("concurrent: %llu faults, %llu pages saved, %llu updates, pause %.0f us",
		 (unsigned long long)res.faults, (unsigned long long)res.saved,
		 (unsigned long long)res.updates, res.pause_us);
	wl_destroy(&wl);
	close(fd);
}

/* Writers stopped by the workload's time bound while the copier runs. */
static void t_writers_stop(void)
{
	struct wl wl;
	struct wl_result res;
	char path[64];
	int err, fd;

	if (skip_no_wp("snapshot-writers-stop"))
		return;
	fd = memfd_create("wl", MFD_CLOEXEC);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	err = wl_init(&wl, 8UL << 20, 2, false);
	wl.write_ms = 1;
	if (!err)
		err = wl_start(&wl);
	if (!err) {
		usleep(20000);
		err = wl_snap_uffdwp(&wl, path, 1UL << 20, &res);
	}
	tap_check(!err && res.verified && !wl.running, "snapshot-writers-stop",
		  "err %d, %s, writers %s", err, res.why,
		  wl.running ? "still running" : "stopped");
	wl_destroy(&wl);
	close(fd);
}

/*
 * The fd sink into a pipe: before each read, wait until a thread
 * of ours is blocked in write(2) on the pipe and note the length it asked
 * for (/proc/self/task/TID/syscall).  Pieces must be at most 16 KiB.
 */
struct pieces {
	int rfd, wfd;
	char *buf;
	size_t len, got, max_piece, seen;
	int err;
};

/* Is descriptor A open on the same file as FD?  (The library writes to
 * its own duplicate of the sink.) */
static bool same_file(unsigned long a, int fd)
{
	struct stat x, y;

	return a < (unsigned long)INT_MAX && !fstat((int)a, &x) &&
	       !fstat(fd, &y) && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

static long blocked_write_len(int fd)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	long ret = -1;

	while (d && (e = readdir(d))) {
		char path[300], line[256];
		unsigned long a0, a1, a2;
		long nr;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/syscall", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(line, sizeof(line), f) &&
		    sscanf(line, "%ld 0x%lx 0x%lx 0x%lx", &nr, &a0, &a1, &a2) == 4 &&
		    nr == SYS_write && same_file(a0, fd))
			ret = (long)a2;
		fclose(f);
	}
	if (d)
		closedir(d);
	return ret;
}

static void *pieces_main(void *arg)
{
	struct pieces *pc = arg;

	long cap = fcntl(pc->rfd, F_GETPIPE_SZ);

	while (pc->got < pc->len) {
		long w = -1;
		int queued = 0;
		ssize_t n;

		/* Let the pipe fill up (at most 2 s): only a full pipe with
		 * more to come has a writer blocked. */
		for (int i = 0; i < 2000; i++) {
			if (ioctl(pc->rfd, FIONREAD, &queued) || queued >= cap ||
			    pc->got + (size_t)queued >= pc->len)
				break;
			usleep(1000);
		}
		if (ioctl(pc->rfd, FIONREAD, &queued) || queued < cap ||
		    pc->got + (size_t)queued >= pc->len)
			w = -2;
		for (int i = 0; i < 10000 && w == -1; i++) {
			w = blocked_write_len(pc->wfd);
			if (w < 0)
				usleep(1000);
		}
		if (w >= 0) {
			pc->seen++;
			if ((size_t)w > pc->max_piece)
				pc->max_piece = (size_t)w;
		}
		n = read(pc->rfd, pc->buf + pc->got, pc->len - pc->got);
		if (n <= 0) {
			pc->err = n < 0 ? -errno : -EPIPE;
			break;
		}
		pc->got += (size_t)n;
	}
	return NULL;
}

static void t_fd_pieces(void)
{
	size_t len = 2UL << 20;		/* one copier chunk */
	char *p = map(len, true), *expect = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1 };
	struct pieces pc = { .len = len, .buf = malloc(len) };
	struct uffdwp_snapshot *s;
	pthread_t th;
	int pfd[2], err;

	if (skip_no_wp("snapshot-fd-pieces"))
		return;
	if (access("/proc/self/syscall", R_OK)) {
		tap_skip("snapshot-fd-pieces", "no /proc/PID/syscall: %s", strerror(errno));
		return;
	}
	if (!p || !expect || !pc.buf || pipe2(pfd, O_CLOEXEC)) {
		tap_fail("snapshot-fd-pieces", "setup: %s", strerror(errno));
		return;
	}
	fill(p, len, 7);
	memcpy(expect, p, len);
	pc.rfd = pfd[0];
	pc.wfd = pfd[1];
	pthread_create(&th, NULL, pieces_main, &pc);
	o.sink_fd = pfd[1];
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err) {
		err = uffdwp_snapshot_wait(s, 120000);
		uffdwp_snapshot_free(s);
	}
	close(pfd[1]);		/* unblocks the reader whatever happened */
	pthread_join(th, NULL);
	if (!err && !pc.err && pc.got == len && pc.seen == 0 &&
	    !memcmp(pc.buf, expect, len)) {
		/* The data arrived but the copier was never caught blocked in
		 * write(2) (the build host's kernel shows it running), so the
		 * size of its writes could not be observed. */
		tap_skip("snapshot-fd-pieces",
			 "the copier was never seen blocked in write(2) on this kernel; data was correct");
		close(pfd[0]);
		free(expect);
		free(pc.buf);
		munmap(p, len);
		return;
	}
	tap_check(!err && !pc.err && pc.got == len && pc.seen > 0 &&
		  pc.max_piece <= 16384 && !memcmp(pc.buf, expect, len),
		  "snapshot-fd-pieces",
		  "snapshot %d, reader %d, %zu of %zu bytes, %zu blocked writes seen, largest asked %zu (max 16384), data %s",
		  err, pc.err, pc.got, len, pc.seen, pc.max_piece,
		  pc.got == len && !memcmp(pc.buf, expect, len) ? "same" : "differs");
	close(pfd[0]);
	free(pc.buf);
	free(expect);
}

/* The check itself must reject a copy made of two instants. */
static void t_verify_rejects_mixed(void)
{
	size_t len = 4UL << 20;
	struct wl wl;
	struct wl_result res = { 0 };
	uint64_t lo[2], hi[2];
	struct wl_rec *a = malloc(len), *b = malloc(len);
	bool ok_a, ok_mixed;
	int err = wl_init(&wl, len, 2, false);

	if (!err)
		err = wl_start(&wl);
	if (err || !a || !b) {
		tap_fail("verify-rejects-mixed", "setup: %s", strerror(-err));
		return;
	}
	/* A consistent copy at instant A: writers stopped. */
	wl_stop(&wl);
	memcpy(a, wl.arena, len);
	wl_seqs(&wl, lo);
	/* Until writer 0 has gone past all its records once (a loaded
	 * machine may not run it within one 50 ms slice), at most 5 s. */
	for (int i = 0; i < 100; i++) {
		wl_start(&wl);
		usleep(50000);
		wl_stop(&wl);
		wl_seqs(&wl, hi);
		if (hi[0] > lo[0] + wl.w[0].nrec)
			break;
	}
	memcpy(b, wl.arena, len);
	ok_a = wl_verify(&wl, a, lo, lo, &res);
	/* First half from A, second half from B. */
	memcpy((char *)a + len / 2, (char *)b + len / 2, len / 2);
	ok_mixed = wl_verify(&wl, a, lo, hi, &res);
	tap_check(ok_a && !ok_mixed && hi[0] > lo[0] + wl.w[0].nrec,
		  "verify-rejects-mixed",
		  "consistent copy %s, mixed copy %s (writer 0 advanced %llu)",
		  ok_a ? "accepted" : "rejected",
		  ok_mixed ? "accepted" : "rejected",
		  (unsigned long long)(hi[0] - lo[0]));
	wl_destroy(&wl);
	free(a);
	free(b);
}

/* A thread that writes 0xAB at OFF in each of PAGES pieces of STEP bytes
 * (0: the page size), last piece first. */
struct rev_writer {
	pthread_t th;
	char *p;
	size_t pages, step, off;
	volatile int done;
};

static void *rev_main(void *arg)
{
	struct rev_writer *w = arg;
	size_t step = w->step ? w->step : (size_t)psz;

	for (size_t i = w->pages; i-- > 0;)
		w->p[i * step + w->off] = (char)0xAB;
	w->done = 1;
	return NULL;
}

/* Writes far ahead of the copier with a 2-page cap: old data in the
 * snapshot, new data in memory, side buffer never above the cap, the rest
 * spilled. */
static void t_cap(void)
{
	size_t pages = 2048, len = pages * psz;	/* 4 chunks */
	char *p = map(len, false), *expect = malloc(len), *buf = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn,
					  .side_cap = 2 * psz };
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_snapshot *s = NULL;
	struct rev_writer w = { .p = p, .pages = pages };
	struct collect c;
	bool mem_ok = true;
	int err;

	if (skip_no_wp("snapshot-cap"))
		return;
	fill(p, len, 3);
	memcpy(expect, p, len);
	collect_init(&c, buf, &r, 1);
	c.delay_us = 20000;	/* a slow sink: the writer gets ahead */
	o.sink_arg = &c;
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err) {
		pthread_create(&w.th, NULL, rev_main, &w);
		err = uffdwp_snapshot_wait(s, 120000);
		pthread_join(w.th, NULL);
		uffdwp_snapshot_stats(s, &st);
		uffdwp_snapshot_free(s);
	}
	for (size_t i = 0; i < pages; i++)
		mem_ok &= p[i * psz] == (char)0xAB;
	tap_check(!err && !memcmp(buf, expect, len) && mem_ok &&
		  st.side_cap == 2 * (uint64_t)psz && st.side_peak <= st.side_cap &&
		  st.saved > 0 && !st.side_waits, "snapshot-cap",
		  "err %d, snapshot %s, memory %s, side peak %llu cap %llu, saved %llu, waited %llu",
		  err, memcmp(buf, expect, len) ? "differs" : "same",
		  mem_ok ? "written" : "NOT written",
		  (unsigned long long)st.side_peak,
		  (unsigned long long)st.side_cap, (unsigned long long)st.saved,
		  (unsigned long long)st.side_waits);
	tap_diag("cap: %llu faults, %llu saved, %llu spilled (memfd peak %llu KiB)",
		 (unsigned long long)st.faults, (unsigned long long)st.saved,
		 (unsigned long long)st.spilled,
		 (unsigned long long)(st.spill_peak >> 10));
	free(expect);
	free(buf);
}

/* Never-touched pages written during the snapshot must snapshot as 0. */
static void t_unpopulated_one(const char *name, unsigned int flags, bool thp)
{
	size_t pages = 1024, len = pages * psz;
	char *p = map(len, thp), *buf = malloc(len), *expect = calloc(1, len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn,
					  .flags = flags };
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_snapshot *s;
	struct rev_writer w = { .p = p, .pages = pages };
	struct collect c;
	bool mem_ok = true, want_unpop;
	int err;

	if (skip_no_wp(name))
		return;
	/* Touch the first half only (with THP, the first 2 MiB extent). */
	fill(p, len / 2, 4);
	memcpy(expect, p, len / 2);
	collect_init(&c, buf, &r, 1);
	c.delay_us = 2000;
	o.sink_arg = &c;
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err) {
		pthread_create(&w.th, NULL, rev_main, &w);
		err = uffdwp_snapshot_wait(s, 120000);
		pthread_join(w.th, NULL);
		uffdwp_snapshot_stats(s, &st);
		uffdwp_snapshot_free(s);
	}
	for (size_t i = 0; i < pages; i++)
		mem_ok &= p[i * psz] == (char)0xAB;
	want_unpop = f.wp_unpopulated && !(flags & UFFDWP_SNAP_NO_UNPOPULATED);
	tap_check(!err && !memcmp(buf, expect, len) && mem_ok &&
		  st.used_unpopulated == want_unpop, name,
		  "err %d, snapshot %s, memory %s, used WP_UNPOPULATED %d (want %d)",
		  err, memcmp(buf, expect, len) ? "differs" : "same",
		  mem_ok ? "written" : "NOT written", st.used_unpopulated,
		  want_unpop);
	free(buf);
	free(expect);
}

static void t_unpopulated(void)
{
	t_unpopulated_one("snapshot-unpopulated", 0, false);
	t_unpopulated_one("snapshot-populate-fallback",
			  UFFDWP_SNAP_NO_UNPOPULATED, false);
	if (!f.thp) {
		tap_skip("snapshot-thp", "transparent hugepages are off");
		return;
	}
	t_unpopulated_one("snapshot-thp", 0, true);
}

/* A writer stuck on a protected page while the sink is slow must be let go
 * by cancel; wait then says -ECANCELED and cancel again -EALREADY. */
static void t_cancel(void)
{
	size_t pages = 2048, len = pages * psz;	/* 4 chunks of 2 MiB */
	char *p = map(len, false), *buf = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn };
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_snapshot *s;
	struct rev_writer w = { .p = p, .pages = pages };
	struct collect c;
	int err, werr = 0, cerr = 0, again = 0;

	if (skip_no_wp("snapshot-cancel") | skip_no_wp("snapshot-sink-error"))
		return;
	fill(p, len, 5);
	collect_init(&c, buf, &r, 1);
	c.delay_us = 300000;
	o.sink_arg = &c;
	o.side_cap = psz;	/* one saved page, the rest spilled */
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err) {
		pthread_create(&w.th, NULL, rev_main, &w);
		werr = uffdwp_snapshot_wait(s, 0);
		cerr = uffdwp_snapshot_cancel(s);
		err = uffdwp_snapshot_wait(s, -1);
		again = uffdwp_snapshot_cancel(s);
		uffdwp_snapshot_stats(s, &st);
		for (int i = 0; i < 500 && !w.done; i++)
			usleep(10000);
		if (w.done)
			pthread_join(w.th, NULL);
		uffdwp_snapshot_free(s);
	}
	tap_check(werr == -ETIMEDOUT && !cerr && err == -ECANCELED &&
		  again == -EALREADY && w.done && st.done &&
		  st.pages_copied < st.pages, "snapshot-cancel",
		  "wait(0) %d, cancel %d, wait %d, cancel again %d, writer %s, copied %llu of %llu",
		  werr, cerr, err, again, w.done ? "released" : "STUCK",
		  (unsigned long long)st.pages_copied,
		  (unsigned long long)st.pages);

	/* A sink error stops the snapshot the same way. */
	fill(p, len, 6);
	collect_init(&c, buf, &r, 1);
	c.fail_at = 2;
	c.delay_us = 100000;
	o.sink_arg = &c;
	memset(&w, 0, sizeof(w));
	w.p = p;
	w.pages = pages;
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err) {
		pthread_create(&w.th, NULL, rev_main, &w);
		err = uffdwp_snapshot_wait(s, -1);
		for (int i = 0; i < 500 && !w.done; i++)
			usleep(10000);
		if (w.done)
			pthread_join(w.th, NULL);
		uffdwp_snapshot_free(s);
	}
	tap_check(err == -EIO && w.done && c.calls == 2, "snapshot-sink-error",
		  "wait %d (want -EIO), writer %s, sink calls %d",
		  err, w.done ? "released" : "STUCK", c.calls);
}

/*
 * snapshot-kernel-writes: read(2) from a pipe and pread(2) from a file
 * into pages the copier has not reached (the last 2 MiB chunk, while the
 * sink holds the copier on every chunk) succeed, go through the snapshot's
 * fault handler, and the snapshot still holds the pages as they were.
 * (recv(2) copies to user memory the same way; the guests have no sockets.)
 */
static void t_kernel_writes(void)
{
	const char *name = "snapshot-kernel-writes";
	size_t pages = 2048, len = pages * psz;	/* 4 chunks of 2 MiB */
	char *p = map(len, false), *buf = malloc(len), *orig = malloc(len);
	char *rd = p + len - 4 * psz, *rv = p + len - 2 * psz;
	char path[] = "/tmp/snapshot-kernel-writes-XXXXXX";
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn };
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_snapshot *s;
	ssize_t nr = -2, nv = -2;
	int pfd[2] = { -1, -1 }, ffd, err, werr = -1, er = 0, ev = 0;
	uint64_t faults0 = 0;
	struct collect c;
	long bad = -1;

	if (skip_no_wp(name))
		return;
	ffd = mkstemp(path);
	if (!p || !buf || !orig || ffd < 0 || pipe(pfd)) {
		tap_fail(name, "setup: %s", strerror(errno));
		goto out;
	}
	unlink(path);
	fill(p, len, 11);
	memcpy(orig, p, len);
	/* The data the system calls will write: 2 pages each. */
	fill(buf, 4 * psz, 12);
	if (write(pfd[1], buf, 2 * psz) != (ssize_t)(2 * psz) ||
	    pwrite(ffd, buf + 2 * psz, 2 * psz, 0) != (ssize_t)(2 * psz)) {
		tap_fail(name, "filling the pipe/file: %s", strerror(errno));
		goto out;
	}
	collect_init(&c, buf, &r, 1);
	c.delay_us = 400000;	/* the copier waits on every chunk */
	o.sink_arg = &c;
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (err) {
		tap_fail(name, "start: %s", strerror(-err));
		goto out;
	}
	uffdwp_snapshot_stats(s, &st);
	faults0 = st.faults;
	nr = read(pfd[0], rd, 2 * psz);
	er = errno;
	nv = pread(ffd, rv, 2 * psz, 0);
	ev = errno;
	uffdwp_snapshot_stats(s, &st);
	werr = uffdwp_snapshot_wait(s, -1);
	uffdwp_snapshot_free(s);
	for (size_t i = 0; i < len && bad < 0; i++)
		if (buf[i] != orig[i])
			bad = (long)i;
	fill(orig, 4 * psz, 12);	/* what the pages must hold now */
	tap_check(nr == 2 * (ssize_t)psz && nv == 2 * (ssize_t)psz && !werr &&
		  bad < 0 && !memcmp(rd, orig, 2 * psz) &&
		  !memcmp(rv, orig + 2 * psz, 2 * psz) &&
		  st.faults >= faults0 + 4 && !st.user_mode_only, name,
		  "read %zd (%s), pread %zd (%s), wait %d, snapshot first wrong byte %ld, faults %llu -> %llu (want +4), user_mode_only %d",
		  nr, nr < 0 ? strerror(er) : "ok", nv,
		  nv < 0 ? strerror(ev) : "ok", werr, bad,
		  (unsigned long long)faults0, (unsigned long long)st.faults,
		  st.user_mode_only);
out:
	if (pfd[0] >= 0) {
		close(pfd[0]);
		close(pfd[1]);
	}
	if (ffd >= 0)
		close(ffd);
	free(buf);
	free(orig);
	if (p)
		munmap(p, len);
}
/* ---- writers never wait for the copier ---- */

/* Wait up to 60 s for W to finish: the positive signal that it was not
 * held (a held writer makes the test fail, not hang). */
static bool writer_finished(volatile int *done)
{
	for (int i = 0; i < 6000 && !*done; i++)
		usleep(10000);
	return *done;
}

/* Reads a pipe into BUF until LEN bytes or end of file. */
struct pipe_reader {
	pthread_t th;
	int fd;
	char *buf;
	size_t len, got;
};

static void *pipe_reader_main(void *arg)
{
	struct pipe_reader *pr = arg;

	while (pr->got < pr->len) {
		ssize_t n = read(pr->fd, pr->buf + pr->got, pr->len - pr->got);

		if (n <= 0)
			break;
		pr->got += (size_t)n;
	}
	return NULL;
}


/*
 * Snapshot R with the copier held before its first chunk while W runs.
 * *HELD_OK: W finished while the copier was held (within 60 s; then the
 * copier is let go anyway).  MID: the stats at that point, and *HUGE_MID
 * (if not NULL) the PMD-mapped blocks of R then; ST: the stats at the end.
 * Returns the start's or the wait's error.
 */
static int run_held(struct uffdwp_region *r, struct uffdwp_snapshot_opts *o,
		    struct rev_writer *w, bool *held_ok,
		    struct uffdwp_snapshot_stats *mid,
		    struct uffdwp_snapshot_stats *st, long *huge_mid)
{
	struct uffdwp_snapshot *s = NULL;
	int err;

	gate_hold();
	err = uffdwp_snapshot_start(&s, r, 1, o);
	if (!err) {
		pthread_create(&w->th, NULL, rev_main, w);
		*held_ok = writer_finished(&w->done);
		uffdwp_snapshot_stats(s, mid);
		if (huge_mid)
			*huge_mid = pmd_mapped_blocks(r->addr, r->len);
		gate_open();
		err = uffdwp_snapshot_wait(s, 120000);
		pthread_join(w->th, NULL);
		uffdwp_snapshot_stats(s, st);
		uffdwp_snapshot_free(s);
	}
	gate_remove();
	return err;
}

enum sink_kind { SINK_CALLBACK, SINK_PIPE, SINK_FILE };

/*
 * snapshot-never-waits-{callback,pipe,file}: the copier is held before its
 * first chunk and the cap is one page, so every page a writer touches must
 * be saved without the copier: one in the side buffer, the rest spilled.
 * The writer must finish while the copier is still held; then the
 * snapshot is the memory before the writes.  The file sink starts at an
 * offset of 16 bytes and must end positioned after the last page.
 */
static void t_never_waits_one(enum sink_kind kind)
{
	static const char *const names[] = {
		"snapshot-never-waits-callback", "snapshot-never-waits-pipe",
		"snapshot-never-waits-file",
	};
	const char *name = names[kind];
	size_t pages = 2048, len = pages * psz;	/* 4 chunks of 2 MiB */
	char *p = map(len, false), *expect = malloc(len), *buf = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .side_cap = psz };
	struct uffdwp_snapshot_stats st = { 0 }, mid = { 0 };
	struct rev_writer w = { .p = p, .pages = pages };
	struct pipe_reader pr = { .fd = -1, .buf = buf, .len = len };
	int pfd[2] = { -1, -1 }, fd = -1, err;
	bool held_ok = false, mem_ok = true, data_ok, pos_ok = true;
	struct collect c;
	off_t end = 0;

	if (skip_no_wp(name))
		return;
	fill(p, len, 11 + kind);
	memcpy(expect, p, len);
	memset(buf, 0, len);
	if (kind == SINK_CALLBACK) {
		collect_init(&c, buf, &r, 1);
		o.sink = collect_fn;
		o.sink_arg = &c;
	} else if (kind == SINK_PIPE) {
		if (pipe2(pfd, O_CLOEXEC)) {
			tap_fail(name, "pipe: %s", strerror(errno));
			return;
		}
		o.sink_fd = pfd[1];
		pr.fd = pfd[0];
		pthread_create(&pr.th, NULL, pipe_reader_main, &pr);
	} else {
		char tmpl[] = "/tmp/lib-snapshot-XXXXXX";

		fd = mkostemp(tmpl, O_CLOEXEC);
		if (fd < 0 || write(fd, "sixteen bytes in", 16) != 16) {
			tap_fail(name, "temporary file: %s", strerror(errno));
			return;
		}
		unlink(tmpl);
		o.sink_fd = fd;
	}
	err = run_held(&r, &o, &w, &held_ok, &mid, &st, NULL);
	if (kind == SINK_PIPE) {
		close(pfd[1]);
		pthread_join(pr.th, NULL);
		close(pfd[0]);
	} else if (kind == SINK_FILE) {
		end = lseek(fd, 0, SEEK_CUR);
		pos_ok = end == (off_t)(16 + len) &&
			 pread(fd, buf, len, 16) == (ssize_t)len;
		close(fd);
	}
	for (size_t i = 0; i < pages; i++)
		mem_ok &= p[i * psz] == (char)0xAB;
	data_ok = !memcmp(buf, expect, len);
	tap_check(!err && held_ok && data_ok && mem_ok && pos_ok &&
		  mid.saved == 1 && mid.spilled == pages - 1 &&
		  mid.fault_max_ns > 0 && !mid.huge_blocks &&
		  st.side_peak == (uint64_t)psz && !st.side_waits &&
		  (kind == SINK_FILE ? !st.spill_peak :
		   st.spill_peak == (pages - 1) * psz),
		  name,
		  "err %d, writer %s, snapshot %s, memory %s, file end %lld, saved %llu spilled %llu while held, longest fault %llu ns, huge blocks %llu, side peak %llu, memfd peak %llu",
		  err, held_ok ? "done while the copier was held" : "HELD",
		  data_ok ? "same" : "differs", mem_ok ? "written" : "NOT written",
		  (long long)end, (unsigned long long)mid.saved,
		  (unsigned long long)mid.spilled,
		  (unsigned long long)mid.fault_max_ns,
		  (unsigned long long)mid.huge_blocks,
		  (unsigned long long)st.side_peak,
		  (unsigned long long)st.spill_peak);
	munmap(p, len);
	free(expect);
	free(buf);
}

/* snapshot-spill-error: a spill that cannot be written (the file sink
 * over RLIMIT_FSIZE) fails the snapshot with -EFBIG and lets the writer
 * go; nothing hangs. */
static void t_spill_error(void)
{
	const char *name = "snapshot-spill-error";
	size_t pages = 2048, len = pages * psz;
	char *p = map(len, false);
	char tmpl[] = "/tmp/lib-snapshot-XXXXXX";
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .side_cap = psz };
	struct uffdwp_snapshot *s = NULL;
	struct rev_writer w = { .p = p, .pages = pages };
	struct rlimit old, lim = { .rlim_cur = len / 2 };
	bool released = false;
	int err;

	if (skip_no_wp(name))
		return;
	fill(p, len, 21);
	o.sink_fd = mkostemp(tmpl, O_CLOEXEC);
	if (o.sink_fd < 0 || getrlimit(RLIMIT_FSIZE, &old)) {
		tap_fail(name, "setup: %s", strerror(errno));
		return;
	}
	unlink(tmpl);
	lim.rlim_max = old.rlim_max;
	signal(SIGXFSZ, SIG_IGN);
	gate_hold();
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err && setrlimit(RLIMIT_FSIZE, &lim))
		err = -errno;
	if (!err) {
		/* The last page's spill lands past the limit. */
		pthread_create(&w.th, NULL, rev_main, &w);
		released = writer_finished(&w.done);
		gate_open();
		err = uffdwp_snapshot_wait(s, 120000);
		pthread_join(w.th, NULL);
	}
	setrlimit(RLIMIT_FSIZE, &old);
	signal(SIGXFSZ, SIG_DFL);
	gate_remove();
	uffdwp_snapshot_free(s);
	close(o.sink_fd);
	tap_check(err == -EFBIG && released, name,
		  "wait %d (want -EFBIG), writer %s", err,
		  released ? "released" : "HELD");
	munmap(p, len);
}


/*
 * snapshot-thp-kept: an arena of four PMD-mapped THPs, the copier held,
 * a 1 MiB cap (a block's 512 pages: 256 to the side buffer, the rest
 * spilled).  One write per block must save the whole block, release the
 * writer, and leave every block PMD-mapped, during and after the snapshot;
 * the snapshot is the memory before the writes.
 */
static void t_thp_kept(void)
{
	const char *name = "snapshot-thp-kept";
	size_t blocks = 4, len = blocks << 21;
	char *p = map(len, true), *expect = malloc(len), *buf = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn,
					  .side_cap = 1UL << 20 };
	struct uffdwp_snapshot_stats st = { 0 }, mid = { 0 };
	/* One write in the middle of each 2 MiB block. */
	struct rev_writer w = { .p = p, .pages = blocks, .step = 2UL << 20,
				.off = 1UL << 20 };
	long before, during = -1, after = -1;
	bool held_ok = false, data_ok, mem_ok = true;
	struct collect c;
	int err;

	if (skip_no_wp(name))
		return;
	if (!f.thp) {
		tap_skip(name, "transparent hugepages are off");
		return;
	}
	fill(p, len, 31);
	before = make_pmd_mapped(p, len);
	if (before != (long)blocks) {
		tap_skip(name, "the arena got %ld of %zu blocks PMD-mapped (%s)",
			 before, blocks, before < 0 ? strerror((int)-before) :
			 "no free huge page");
		return;
	}
	memcpy(expect, p, len);
	collect_init(&c, buf, &r, 1);
	o.sink_arg = &c;
	err = run_held(&r, &o, &w, &held_ok, &mid, &st, &during);
	if (!err)
		after = pmd_mapped_blocks(p, len);
	for (size_t b = 0; b < blocks; b++)
		mem_ok &= p[b * (2UL << 20) + (1UL << 20)] == (char)0xAB;
	data_ok = !memcmp(buf, expect, len);
	tap_check(!err && held_ok && data_ok && mem_ok &&
		  mid.huge_blocks == blocks && mid.huge_saves == blocks &&
		  mid.saved + mid.spilled == blocks * 512 &&
		  during == (long)blocks && after == (long)blocks, name,
		  "err %d, writer %s, snapshot %s, memory %s, huge blocks %llu at start, %llu saved whole, pages saved %llu + spilled %llu, PMD-mapped during %ld after %ld (of %zu)",
		  err, held_ok ? "released" : "HELD", data_ok ? "same" : "differs",
		  mem_ok ? "written" : "NOT written",
		  (unsigned long long)mid.huge_blocks,
		  (unsigned long long)mid.huge_saves,
		  (unsigned long long)mid.saved, (unsigned long long)mid.spilled,
		  during, after, blocks);
	munmap(p, len);
	free(expect);
	free(buf);
}

/*
 * snapshot-discard-during: with UFFDWP_SNAP_DISCARD_FAIL and the copier
 * held before its first chunk, a page is discarded.  Its contents at the
 * instant are gone, so the snapshot must fail with -EAGAIN (not hand the
 * sink zeroes), and the writers must be free at once (a write to another
 * page goes through while the copier is still held).
 */
static void t_discard_during(void)
{
	const char *name = "snapshot-discard-during";
	size_t len = 16 * psz;
	char *p = map(len, false), *buf = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn,
					  .flags = UFFDWP_SNAP_DISCARD_FAIL };
	struct uffdwp_snapshot *s = NULL;
	struct rev_writer w = { .p = p + 8 * psz, .pages = 1 };
	struct collect c;
	bool released = false, started = false;
	int err, res = 0;

	if (skip_no_wp(name))
		return;
	fill(p, len, 13);
	collect_init(&c, buf, &r, 1);
	o.sink_arg = &c;
	gate_hold();
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err && madvise(p + 3 * psz, psz, MADV_DONTNEED))
		err = -errno;
	if (!err) {
		started = !pthread_create(&w.th, NULL, rev_main, &w);
		released = started && writer_finished(&w.done);
	}
	gate_remove();
	if (s) {
		res = uffdwp_snapshot_wait(s, 120000);
		uffdwp_snapshot_free(s);
	}
	if (started)
		pthread_join(w.th, NULL);
	tap_check(!err && res == -EAGAIN && released && !c.calls, name,
		  "err %d, the snapshot returned %d (want -EAGAIN), a writer %s while the copier was held, %d sink calls (want 0)",
		  err, res, released ? "went on" : "WAITED", c.calls);
	munmap(p, len);
	free(buf);
}

/*
 * snapshot-discard-zero: by default (private anonymous memory), with the
 * copier held, a page not copied yet is discarded: the snapshot succeeds,
 * the page is stored as zeroes (what the program reads after giving it
 * back) and every other page as it was at the instant.
 */
static void t_discard_zero(void)
{
	const char *name = "snapshot-discard-zero";
	size_t len = 16 * psz;
	char *p = map(len, false), *buf = malloc(len), *want = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn };
	struct uffdwp_snapshot *s = NULL;
	struct collect c;
	int err, res = -1;

	if (skip_no_wp(name))
		return;
	fill(p, len, 14);
	memcpy(want, p, len);
	memset(want + 3 * psz, 0, psz);
	collect_init(&c, buf, &r, 1);
	o.sink_arg = &c;
	gate_hold();
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err && madvise(p + 3 * psz, psz, MADV_DONTNEED))
		err = -errno;
	if (!err)
		p[5 * psz] = 1;		/* after the instant: not in the copy */
	gate_remove();
	if (s) {
		res = uffdwp_snapshot_wait(s, 120000);
		uffdwp_snapshot_free(s);
	}
	tap_check(!err && !res && !memcmp(buf, want, len), name,
		  "err %d, the snapshot returned %d (want 0), copy %s",
		  err, res, memcmp(buf, want, len) ? "WRONG" : "right");
	munmap(p, len);
	free(buf);
	free(want);
}

/* A sink callback copying the load's arena (one region) into ARG. */
static int arena_sink(void *arg, const void *addr, const void *data,
		      size_t len)
{
	struct { char *img; char *arena; } *a = arg;

	memcpy(a->img + ((const char *)addr - a->arena), data, len);
	return 0;
}

/*
 * snapshot-madvise-load: three snapshots of a 16 MiB arena (half THP)
 * while three writers write it and a thread gives parts of it back
 * (MADV_DONTNEED, MADV_FREE + MADV_PAGEOUT, MADV_PAGEOUT, MADV_COLD),
 * moves them (move_pages()) or forks, every 20 ms (issue #35, item 0):
 * each finishes in bounded time (a watchdog fails the case, not the run)
 * and is one instant of the writers.
 */
static void t_madvise_load(void)
{
	const char *name = "snapshot-madvise-load";
	struct { char *img; char *arena; } a = { malloc(MLOAD_LEN), NULL };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = arena_sink,
					  .sink_arg = &a };
	struct uffdwp_snapshot_stats st = { 0 };
	struct mload m;
	const char *why = "";
	size_t bad = 0;
	int err, n = 0;

	if (skip_no_wp(name))
		return;
	watchdog_arm(name, 120);
	err = mload_start(&m);
	a.arena = m.arena;
	for (; !err && !bad && n < 3; n++) {
		struct uffdwp_region r = { m.arena, MLOAD_LEN };
		struct uffdwp_snapshot *s = NULL;

		usleep(50000);
		memset(a.img, 0, MLOAD_LEN);
		err = uffdwp_snapshot_start(&s, &r, 1, &o);
		if (!err) {
			err = uffdwp_snapshot_wait(s, 60000);
			uffdwp_snapshot_stats(s, &st);
			uffdwp_snapshot_free(s);
		}
		if (!err)
			bad = mload_check(a.img, &why);
	}
	mload_stop(&m);
	watchdog_disarm();
	tap_check(!err && !bad && n == 3, name,
		  "snapshot %d: error %d, inconsistent at byte %zu (%s)", n, err,
		  bad ? bad - 1 : 0, why);
	tap_diag("madvise-load: %lu dontneed, %lu free+pageout, %lu pageout, %lu cold, %lu move_pages, %lu fork; last: %llu faults, pause %llu us",
		 m.ops[0], m.ops[1], m.ops[2], m.ops[3], m.ops[4], m.ops[5],
		 (unsigned long long)st.faults,
		 (unsigned long long)st.pause_ns / 1000);
	free(a.img);
}

/* ---- misuse: the library fails the call, never the process ---- */

/*
 * Run FN in a child process that SECONDS of alarm() bound: its exit
 * status (0: the case held) or, when a signal ended it, 128 + the signal
 * (SIGALRM: it hung; SIGSEGV: the library crashed it).
 */
static int in_child(int (*fn)(void), int seconds)
{
	pid_t pid = fork();
	int status;

	if (pid < 0)
		return -1;
	if (pid == 0) {
		alarm((unsigned int)seconds);
		_exit(fn());
	}
	if (waitpid(pid, &status, 0) < 0)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) :
	       128 + WTERMSIG(status);
}

static const char *child_said(int st)
{
	static char buf[64];

	if (st == 128 + SIGALRM)
		return "hung (SIGALRM)";
	if (st > 128) {
		snprintf(buf, sizeof(buf), "killed by %s", strsignal(st - 128));
		return buf;
	}
	snprintf(buf, sizeof(buf), "exit %d", st);
	return buf;
}

/* snapshot-unmapped: a region that is not mapped (whole or in part) is
 * -EFAULT from snapshot_start and session_new, at once. */
static int unmapped_child(void)
{
	size_t len = 8 * psz;
	char *p = map(len, false);
	struct uffdwp_region whole = { p, len }, part = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn };
	struct uffdwp_snapshot *s = NULL;
	struct uffdwp_session *ss = NULL;
	struct collect c;
	char *buf = malloc(len);
	int e1, e2, e3;

	collect_init(&c, buf, &whole, 1);
	o.sink_arg = &c;
	munmap(p + 4 * psz, 4 * psz);
	e1 = uffdwp_snapshot_start(&s, &part, 1, &o);
	munmap(p, len);
	e2 = uffdwp_snapshot_start(&s, &whole, 1, &o);
	e3 = uffdwp_session_new(&ss, &whole, 1, NULL);
	if (e1 != -EFAULT || e2 != -EFAULT || e3 != -EFAULT) {
		tap_diag("unmapped: %d %d %d (want -EFAULT)", e1, e2, e3);
		return 1;
	}
	return 0;
}

/* snapshot-prot-none: PROT_NONE, read-only, or part PROT_NONE: -EINVAL,
 * and nothing runs that could fault on it. */
static int prot_child(void)
{
	size_t len = 8 * psz;
	char *p = map(len, false), *q = map(len, false), *h = map(len, false);
	struct uffdwp_region none = { p, len }, ro = { q, len }, half = { h, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn };
	struct uffdwp_snapshot *s = NULL;
	struct uffdwp_session *ss = NULL;
	struct collect c;
	char *buf = malloc(len);
	int e[4];

	collect_init(&c, buf, &none, 1);
	o.sink_arg = &c;
	fill(p, len, 1);
	fill(q, len, 2);
	fill(h, len, 3);
	mprotect(p, len, PROT_NONE);
	mprotect(q, len, PROT_READ);
	mprotect(h + 4 * psz, 4 * psz, PROT_NONE);
	e[0] = uffdwp_snapshot_start(&s, &none, 1, &o);
	if (!e[0])
		e[0] = uffdwp_snapshot_wait(s, 5000) ? -999 : 0;
	e[1] = uffdwp_snapshot_start(&s, &ro, 1, &o);
	e[2] = uffdwp_snapshot_start(&s, &half, 1, &o);
	if (!e[2])
		e[2] = uffdwp_snapshot_wait(s, 5000) ? -999 : 0;
	e[3] = uffdwp_session_new(&ss, &none, 1, NULL);
	if (e[0] != -EINVAL || e[1] != -EINVAL || e[2] != -EINVAL ||
	    e[3] != -EINVAL) {
		tap_diag("prot-none: %d %d %d %d (want -EINVAL)", e[0], e[1],
		       e[2], e[3]);
		return 1;
	}
	return 0;
}

/*
 * snapshot-munmap-during and snapshot-mprotect-during: with the copier
 * held, the second of two 2 MiB chunks of the region is unmapped (which
 * the header forbids) or made PROT_NONE: the snapshot fails with an error
 * (not 0, and not a signal; -EFAULT for PROT_NONE), a writer in the first
 * half goes on, and free returns.
 */
static int changed_during(bool unmap)
{
	const char *what = unmap ? "munmap-during" : "mprotect-during";
	size_t len = 4UL << 20;
	char *p = map(len, false), *buf = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn };
	struct uffdwp_snapshot *s = NULL;
	struct collect c;
	int err, res;

	fill(p, len, unmap ? 4 : 5);
	collect_init(&c, buf, &r, 1);
	o.sink_arg = &c;
	gate_hold();
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (err) {
		tap_diag("%s: start %d", what, err);
		return 1;
	}
	if (unmap)
		munmap(p + len / 2, len / 2);
	else
		mprotect(p + len / 2, len / 2, PROT_NONE);
	gate_remove();
	p[5 * psz] = 1;
	res = uffdwp_snapshot_wait(s, 10000);
	uffdwp_snapshot_free(s);
	if (unmap ? !res || res == -ETIMEDOUT : res != -EFAULT) {
		tap_diag("%s: the snapshot returned %d (want %s)", what, res,
			 unmap ? "an error" : "-EFAULT");
		return 1;
	}
	return 0;
}

static int munmap_child(void)
{
	return changed_during(true);
}

static int mprotect_child(void)
{
	return changed_during(false);
}

static void t_misuse(void)
{
	int st;

	if (skip_no_wp("snapshot-unmapped") | skip_no_wp("snapshot-prot-none") |
	    skip_no_wp("snapshot-munmap-during") |
	    skip_no_wp("snapshot-mprotect-during"))
		return;
	st = in_child(unmapped_child, 20);
	tap_check(!st, "snapshot-unmapped", "child %s", child_said(st));
	st = in_child(prot_child, 20);
	tap_check(!st, "snapshot-prot-none", "child %s", child_said(st));
	st = in_child(munmap_child, 30);
	tap_check(!st, "snapshot-munmap-during", "child %s", child_said(st));
	st = in_child(mprotect_child, 30);
	tap_check(!st, "snapshot-mprotect-during", "child %s", child_said(st));
}

/*
 * snapshot-fork-child-free: a child of fork() frees its copy of a running
 * snapshot (the copier held): the child returns at once (its wait says
 * -ECHILD), the parent's pages stay protected, and the parent's snapshot
 * completes with the memory of its instant.
 */
static struct uffdwp_snapshot *fork_snap, *s_dummy;

static int fork_child(void)
{
	int w = uffdwp_snapshot_wait(fork_snap, 0);

	uffdwp_snapshot_free(fork_snap);
	return w == -ECHILD ? 0 : 2;
}

static void t_fork_child_free(void)
{
	const char *name = "snapshot-fork-child-free";
	size_t len = 16 * psz;
	char *p = map(len, false), *buf = malloc(len), *want = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = collect_fn };
	struct collect c;
	size_t still = 0;
	int err, st = -1, res = -1;

	if (skip_no_wp(name))
		return;
	fill(p, len, 21);
	memcpy(want, p, len);
	collect_init(&c, buf, &r, 1);
	o.sink_arg = &c;
	gate_hold();
	err = uffdwp_snapshot_start(&s_dummy, &r, 1, &o);
	fork_snap = s_dummy;
	if (!err) {
		st = in_child(fork_child, 10);
		for (size_t i = 0; i < len / psz; i++)
			still += page_wp(p + i * psz);
	}
	gate_remove();
	if (!err) {
		p[psz] = 2;
		res = uffdwp_snapshot_wait(fork_snap, 60000);
		uffdwp_snapshot_free(fork_snap);
	}
	tap_check(!err && !st && still == len / psz && !res &&
		  !memcmp(buf, want, len), name,
		  "start %d, child %s, %zu of %zu pages still protected after it, the snapshot returned %d, copy %s",
		  err, child_said(st), still, len / psz, res,
		  memcmp(buf, want, len) ? "WRONG" : "right");
	munmap(p, len);
	free(buf);
	free(want);
}

/*
 * snapshot-sink-dup: the caller closes its sink fd while the copier is
 * held and another file takes its number: the snapshot still goes to the
 * first file (the library's duplicate), the second gets nothing.  And a
 * descriptor that is not open is -EBADF at start.
 */
static void t_sink_dup(void)
{
	const char *name = "snapshot-sink-dup";
	size_t len = 16 * psz;
	char *p = map(len, false), *got = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1 };
	struct uffdwp_snapshot *s = NULL;
	int fa = memfd_create("a", MFD_CLOEXEC), keep = dup(fa), fb = -1;
	int err, res = -1, badf;
	struct stat sb = { 0 };

	if (skip_no_wp(name))
		return;
	fill(p, len, 22);
	o.sink_fd = fa;
	gate_hold();
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	close(fa);
	fb = memfd_create("b", MFD_CLOEXEC);
	if (fb != fa && fb >= 0) {
		dup2(fb, fa);
		close(fb);
	}
	fb = fa;		/* the number now names the second file */
	gate_remove();
	if (!err) {
		res = uffdwp_snapshot_wait(s, 60000);
		uffdwp_snapshot_free(s);
	}
	fstat(fb, &sb);
	memset(got, 0, len);
	if (pread(keep, got, len, 0) != (ssize_t)len)
		memset(got, 0, len);
	/* A descriptor number that is not open: closed just now. */
	o.sink_fd = dup(keep);
	close(o.sink_fd);
	badf = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!badf)
		uffdwp_snapshot_free(s);
	tap_check(!err && !res && sb.st_size == 0 && !memcmp(got, p, len) &&
		  badf == -EBADF, name,
		  "start %d, the snapshot returned %d, the file under the reused number got %lld bytes (want 0), the first file %s; a closed fd: %d (want -EBADF)",
		  err, res, (long long)sb.st_size,
		  memcmp(got, p, len) ? "WRONG" : "right", badf);
	close(fb);
	close(keep);
	munmap(p, len);
	free(got);
}

/*
 * snapshot-sink-writes-regions: the sink callback writes pages of the
 * regions, one the copier has sent already and one it has not reached:
 * no deadlock (uffdwp_snapshot_start(3) says when there is one), and the
 * copy is the memory of the instant.
 */
struct self_writer {
	struct collect c;
	char *p;
	size_t len;
};

static int self_writing_fn(void *arg, const void *addr, const void *data,
			   size_t len)
{
	struct self_writer *w = arg;

	w->p[0] ^= 0x5a;			/* sent already */
	w->p[w->len - 1] ^= 0x5a;		/* not reached yet */
	return collect_fn(&w->c, addr, data, len);
}

static void t_sink_writes_regions(void)
{
	const char *name = "snapshot-sink-writes-regions";
	size_t len = 8UL << 20;
	char *p = map(len, false), *buf = malloc(len), *want = malloc(len);
	struct uffdwp_region r = { p, len };
	struct self_writer w = { .p = p, .len = len };
	struct uffdwp_snapshot_opts o = { .sink_fd = -1, .sink = self_writing_fn,
					  .sink_arg = &w };
	struct uffdwp_snapshot *s = NULL;
	int err, res = -1;

	if (skip_no_wp(name))
		return;
	fill(p, len, 23);
	memcpy(want, p, len);
	collect_init(&w.c, buf, &r, 1);
	watchdog_arm(name, 60);
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err) {
		res = uffdwp_snapshot_wait(s, 30000);
		uffdwp_snapshot_free(s);
	}
	watchdog_disarm();
	tap_check(!err && !res && !memcmp(buf, want, len), name,
		  "start %d, the snapshot returned %d, copy %s", err, res,
		  memcmp(buf, want, len) ? "WRONG" : "right");
	munmap(p, len);
	free(buf);
	free(want);
}

static void t_never_waits(void)
{
	t_never_waits_one(SINK_CALLBACK);
	t_never_waits_one(SINK_PIPE);
	t_never_waits_one(SINK_FILE);
	t_spill_error();
	t_thp_kept();
}


static void t_bad_input(void)
{
	char *p = map(4 * psz, false);
	struct uffdwp_region good = { p, 4 * psz };
	struct uffdwp_region unaligned = { p + 1, psz };
	struct uffdwp_region empty = { p, 0 };
	struct uffdwp_region overlap[2] = { { p, 2 * psz }, { p + psz, 2 * psz } };
	struct uffdwp_snapshot_opts o = { .sink_fd = 1 };
	struct uffdwp_snapshot_opts both = { .sink_fd = 1, .sink = collect_fn };
	struct uffdwp_snapshot_opts none = { .sink_fd = -1 };
	struct uffdwp_snapshot_opts flags = { .sink_fd = 1, .flags = 1u << 30 };
	struct uffdwp_snapshot_opts modes = { .sink_fd = 1,
		.flags = UFFDWP_SNAP_KERNEL_FAULTS | UFFDWP_SNAP_USER_MODE_ONLY };
	struct uffdwp_snapshot_opts reserved = { .sink_fd = 1,
		.__reserved = { [7] = 1 } };
	struct uffdwp_snapshot_opts zeroed = { 0 };
	struct uffdwp_snapshot *s = NULL;
	struct uffdwp_snapshot_stats st;
	struct uffdio_register reg = {
		.range = { (uintptr_t)p, 4 * psz },
		.mode = UFFDIO_REGISTER_MODE_WP,
	};
	int e[15], fd, i = 0;

	if (skip_no_wp("snapshot-bad-input") | skip_no_wp("snapshot-busy"))
		return;
	e[i++] = uffdwp_snapshot_start(NULL, &good, 1, &o);
	e[i++] = uffdwp_snapshot_start(&s, NULL, 1, &o);
	e[i++] = uffdwp_snapshot_start(&s, &good, 0, &o);
	e[i++] = uffdwp_snapshot_start(&s, &unaligned, 1, &o);
	e[i++] = uffdwp_snapshot_start(&s, &empty, 1, &o);
	e[i++] = uffdwp_snapshot_start(&s, overlap, 2, &o);
	e[i++] = uffdwp_snapshot_start(&s, &good, 1, &both);
	e[i++] = uffdwp_snapshot_start(&s, &good, 1, &none);
	e[i++] = uffdwp_snapshot_start(&s, &good, 1, &flags);
	e[i++] = uffdwp_snapshot_start(&s, &good, 1, &modes);
	e[i++] = uffdwp_snapshot_start(&s, &good, 1, &reserved);
	e[i++] = uffdwp_snapshot_start(&s, &good, 1, &zeroed);
	e[i++] = uffdwp_snapshot_start(&s, &good, 1, NULL);
	e[i++] = uffdwp_snapshot_wait(NULL, 0) == -EINVAL &&
		 uffdwp_snapshot_cancel(NULL) == -EINVAL &&
		 uffdwp_snapshot_stats(NULL, &st) == -EINVAL ? -EINVAL : 0;
	uffdwp_snapshot_free(NULL);
	bool ok = s == NULL;
	for (int k = 0; k < i; k++)
		ok &= e[k] == -EINVAL;
	tap_check(ok, "snapshot-bad-input",
		  "results %d %d %d %d %d %d %d %d %d %d %d %d %d %d (all must be -EINVAL)",
		  e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10],
		  e[11], e[12], e[13]);

	/* A region another userfaultfd owns. */
	fd = uffdwp_open(0, UFFD_FEATURE_PAGEFAULT_FLAG_WP, NULL);
	if (fd < 0 || ioctl(fd, UFFDIO_REGISTER, &reg)) {
		tap_fail("snapshot-busy", "setup: %s", strerror(errno));
	} else {
		int err = uffdwp_snapshot_start(&s, &good, 1, &o);

		tap_check(err == -EBUSY, "snapshot-busy",
			  "registered elsewhere: %d, want -EBUSY", err);
		if (!err)
			uffdwp_snapshot_free(s);
	}
	if (fd >= 0)
		close(fd);
}

/*
 * snapshot-completion-fd: uffdwp_snapshot_fd() is an O_CLOEXEC descriptor that
 * poll(2) finds readable exactly when the snapshot has finished: not while
 * the copier is held (the gate), at once when it is let go, and after a
 * cancel; it stays readable; uffdwp_snapshot_stats_v() agrees with
 * uffdwp_snapshot_stats() (DONE in its flags only then).
 */
static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

static void *open_later(void *arg)
{
	(void)arg;
	usleep(200000);
	gate_open();
	return NULL;
}

static void t_snapshot_fd(void)
{
	const char *name = "snapshot-completion-fd";
	size_t len = 1024 * psz;	/* two chunks */
	char *p = map(len, false);
	int sink = memfd_create("sink", MFD_CLOEXEC);
	struct uffdwp_region r = { p, len };
	struct uffdwp_snapshot_opts o = { .sink_fd = sink };
	struct uffdwp_stats_v v1 = { .size = sizeof(v1) }, v2 = v1;
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_snapshot *s = NULL, *s2 = NULL;
	int fd = -1, held = -1, after = -1, stays = -1, cloexec = 0;
	int err, werr = -1, cfd = -1, cancelled = -1, e1 = -1, e2 = -1;

	if (skip_no_wp(name))
		return;
	fill(p, len, 21);
	gate_hold();
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	if (!err) {
		fd = uffdwp_snapshot_fd(s);
		cloexec = fd >= 0 ? fcntl(fd, F_GETFD) & FD_CLOEXEC : 0;
		held = readable(fd, 200);
		e1 = uffdwp_snapshot_stats_v(s, &v1);
		gate_open();
		after = readable(fd, 30000);
		werr = uffdwp_snapshot_wait(s, 0);
		stays = readable(fd, 0);
		e2 = uffdwp_snapshot_stats_v(s, &v2);
		uffdwp_snapshot_stats(s, &st);
	}
	gate_remove();
	uffdwp_snapshot_free(s);
	/* A cancelled snapshot is finished too. */
	gate_hold();
	if (!err && !uffdwp_snapshot_start(&s2, &r, 1, &o)) {
		pthread_t opener;

		cfd = uffdwp_snapshot_fd(s2);
		/* The cancel waits for the copier, held at the gate. */
		pthread_create(&opener, NULL, open_later, NULL);
		uffdwp_snapshot_cancel(s2);
		cancelled = readable(cfd, 0) &&
			    uffdwp_snapshot_wait(s2, 0) == -ECANCELED;
		pthread_join(opener, NULL);
	}
	gate_remove();
	uffdwp_snapshot_free(s2);
	tap_check(!err && fd >= 0 && cloexec && !held && after && !werr &&
		  stays && cfd >= 0 && cancelled == 1 && !e1 &&
		  !e2 && v1.size == sizeof(v1) && !(v1.flags & UFFDWP_STATS_DONE) &&
		  (v2.flags & UFFDWP_STATS_DONE) && v2.pages == st.pages &&
		  v2.pages_copied == st.pages_copied && v2.nregions == 1 &&
		  v2.region_pages == len / psz && v2.dirty_pages == 0 &&
		  v2.fixed_bytes == st.fixed_bytes, name,
		  "start %d, fd %d (cloexec %d): readable while held %d, when let go %d, after wait(%d) %d; cancelled %d; stats_v %d %d (done %u %u, copied %llu of %llu)",
		  err, fd, !!cloexec, held, after, werr, stays, cancelled, e1,
		  e2, v1.flags & UFFDWP_STATS_DONE, v2.flags & UFFDWP_STATS_DONE,
		  (unsigned long long)v2.pages_copied,
		  (unsigned long long)v2.pages);
	close(sink);
	munmap(p, len);
}

int main(void)
{
	psz = sysconf(_SC_PAGESIZE);
	tap_plan(31);
	uffdwp_probe(&f);
	t_static();
	t_concurrent();
	t_writers_stop();
	t_fd_pieces();
	t_verify_rejects_mixed();
	t_cap();
	t_never_waits();
	t_unpopulated();
	t_cancel();
	t_discard_during();
	t_discard_zero();
	t_madvise_load();
	t_misuse();
	t_fork_child_free();
	t_sink_dup();
	t_sink_writes_regions();
	t_kernel_writes();
	t_bad_input();
	t_snapshot_fd();
	return tap_done();
}
