// SPDX-License-Identifier: GPL-2.0
/*
 * lib-session: libuffdwp snapshot sessions and snapshot files.
 *  - a base, then deltas: each delta stores exactly the pages written since
 *    the previous instant (uffdwp_session_dirty() says how many first), and
 *    base + deltas load back byte for byte, into other memory or at the
 *    recorded addresses; a delta of nothing written stores no page;
 *  - with writers running, base + delta is the memory at the delta's
 *    instant (workload/workload.c's record check);
 *  - a write during a delta's copy leaves the old contents in that delta
 *    and the new ones in the next, for a page of the delta (saved, or
 *    spilled into a pipe sink's memfd) and for a clean page alike;
 *  - a page discarded (MADV_DONTNEED) between snapshots is in the next
 *    delta, and so is a write to it after that delta's instant; one
 *    discarded before the copier reached it is stored as zeroes (the
 *    default for private anonymous memory), or with
 *    UFFDWP_SNAP_DISCARD_FAIL fails the snapshot with -EAGAIN, and the
 *    next snapshot is a base;
 *  - a read(2) into a clean page (a kernel-mode write) is in the next delta;
 *  - a write into a PMD-mapped THP puts its whole block in the next delta
 *    and the block stays PMD-mapped through the writes and the instants;
 *  - `uffdwp restore` rebuilds the image from the files;
 *  - bad input: -EINVAL, -EBUSY, -ENOENT; bad files: -EBADMSG,
 *    -EPROTONOSUPPORT, -ESTALE, -EINVAL, -EFAULT, -ESPIPE;
 *  - (0.4) uffdwp_session_fd() readable exactly while the current snapshot
 *    has finished; regions added (the next delta stores them in full,
 *    marked UFFDWP_FILE_REGIONS_CHANGED) and removed (unprotected, out of
 *    later deltas), the chain still loading; their bad input; the dirty
 *    set as ranges; uffdwp_session_stats_v().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "lib_test.h"
#include "uffd_util.h"
#include "uffdwp.h"
#include "workload.h"

static long psz;

static char *map(size_t len)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	madvise(p, len, MADV_NOHUGEPAGE);
	return p;
}

static int new_file(void)
{
	return memfd_create("snap", MFD_CLOEXEC);
}

/* One snapshot of SS into FD, waited for.  Its stats in *ST. */
static int snap(struct uffdwp_session *ss, int fd, unsigned int flags,
		struct uffdwp_snapshot_stats *st)
{
	int err = uffdwp_session_snapshot(ss, fd, flags);

	if (!err)
		err = uffdwp_session_wait(ss, 120000);
	if (!err && st)
		err = uffdwp_session_stats(ss, st);
	return err;
}

/* ---- base and deltas, no concurrent writers ---- */

static void t_base_delta(void)
{
	const char *name = "session-base-delta";
	size_t la = 64 * psz, lb = 16 * psz, total = la + lb;
	char *a = map(la), *b = map(lb), *expect = malloc(total);
	char *img_a = map(la), *img_b = map(lb);
	/* Given backwards: the file keeps address order. */
	struct uffdwp_region r[2] = { { b, lb }, { a, la } };
	struct uffdwp_region sorted[2], img[2];
	struct uffdwp_snapshot_stats s0 = { 0 }, s1 = { 0 }, s2 = { 0 };
	struct uffdwp_snapshot_info i0 = { 0 }, i1 = { 0 }, i2 = { 0 }, last;
	struct uffdwp_session *ss = NULL;
	const size_t wrote[] = { 0, 7, 8, 40, 63 };	/* pages of A */
	ssize_t dirty0 = -1, dirty1 = -1;
	int fds[3] = { new_file(), new_file(), new_file() };
	off_t pos1 = -1;
	bool img_ok = false, back_ok = false, len_ok, order_ok;
	int err, e_img = -1, e_back = -1;

	if (skip_no_wp(name))
		return;
	order_ok = (uintptr_t)a < (uintptr_t)b;
	sorted[0] = order_ok ? r[1] : r[0];
	sorted[1] = order_ok ? r[0] : r[1];
	img[0] = (struct uffdwp_region){ order_ok ? img_a : img_b, sorted[0].len };
	img[1] = (struct uffdwp_region){ order_ok ? img_b : img_a, sorted[1].len };
	fill(a, la, 1);
	fill(b, lb, 2);
	err = uffdwp_session_new(&ss, r, 2, NULL);
	if (!err)
		dirty0 = uffdwp_session_dirty(ss);
	if (!err)
		err = snap(ss, fds[0], 0, &s0);
	for (size_t i = 0; !err && i < sizeof(wrote) / sizeof(wrote[0]); i++)
		a[wrote[i] * psz + 100] ^= 0x5A;
	b[3 * psz] ^= 0x33;	/* and one page of B */
	if (!err)
		dirty1 = uffdwp_session_dirty(ss);
	memcpy(expect, sorted[0].addr, sorted[0].len);
	memcpy(expect + sorted[0].len, sorted[1].addr, sorted[1].len);
	if (!err)
		err = snap(ss, fds[1], 0, &s1);
	/* Nothing written: an empty delta. */
	if (!err)
		err = snap(ss, fds[2], 0, &s2);
	/* The writer leaves the offset at the end; the header is read
	 * where the offset is: rewind. */
	pos1 = lseek(fds[1], 0, SEEK_CUR);
	for (int i = 0; i < 3; i++)
		lseek(fds[i], 0, SEEK_SET);
	len_ok = !err &&
		 uffdwp_snapshot_read_info(fds[0], &i0, NULL, 0) == 2 &&
		 uffdwp_snapshot_read_info(fds[1], &i1, NULL, 0) == 2 &&
		 uffdwp_snapshot_read_info(fds[2], &i2, NULL, 0) == 2 &&
		 pos1 == (off_t)i1.file_len &&
		 lseek(fds[1], 0, SEEK_END) == (off_t)i1.file_len &&
		 /* each stored page: its bytes and its sum (format 2) */
		 i1.file_len == i2.file_len + 6 * ((uint64_t)psz + 8);
	if (!err) {
		e_img = load_chain(fds, 3, img, 2, &last);
		img_ok = !e_img && !memcmp(img[0].addr, expect, img[0].len) &&
			 !memcmp(img[1].addr, expect + img[0].len, img[1].len) &&
			 last.epoch == 2;
	}
	/* Scribble, then load at the recorded addresses (the regions are
	 * still in the session: the loader's writes go through it). */
	if (!err) {
		fill(a, la, 9);
		fill(b, lb, 9);
		e_back = load_chain(fds, 3, NULL, 0, NULL);
		back_ok = !e_back && !memcmp(sorted[0].addr, expect, sorted[0].len) &&
			  !memcmp(sorted[1].addr, expect + sorted[0].len,
				  sorted[1].len);
	}
	uffdwp_session_free(ss);
	tap_check(!err && dirty0 == 0 && dirty1 == 6 &&
		  s0.pages == total / psz && s0.epoch == 0 &&
		  s1.pages == 6 && s1.epoch == 1 && s1.pages_copied == 6 &&
		  s2.pages == 0 && s2.epoch == 2 &&
		  i0.kind == UFFDWP_FILE_BASE && i1.kind == UFFDWP_FILE_DELTA &&
		  i0.session == i1.session && i0.pages == total / psz &&
		  i1.pages == 6 && len_ok && img_ok && back_ok, name,
		  "err %d, dirty %zd then %zd (want 0, 6), pages %llu/%llu/%llu epochs %llu/%llu/%llu, kinds %u/%u, sessions %s, lengths %s, image %s (%d), in place %s (%d)",
		  err, dirty0, dirty1, (unsigned long long)s0.pages,
		  (unsigned long long)s1.pages, (unsigned long long)s2.pages,
		  (unsigned long long)s0.epoch, (unsigned long long)s1.epoch,
		  (unsigned long long)s2.epoch, i0.kind, i1.kind,
		  i0.session == i1.session ? "same" : "differ",
		  len_ok ? "right" : "wrong", img_ok ? "same" : "differs", e_img,
		  back_ok ? "same" : "differs", e_back);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	munmap(a, la);
	munmap(b, lb);
	munmap(img_a, la);
	munmap(img_b, lb);
	free(expect);
}

/* ---- with writers: base + delta is the memory at the delta's instant ---- */

static void t_concurrent(void)
{
	const char *name = "session-concurrent";
	struct uffdwp_snapshot_stats s1 = { 0 };
	struct uffdwp_session *ss = NULL;
	struct wl_result res = { 0 };
	struct uffdwp_region r, img;
	int fds[2] = { new_file(), new_file() };
	uint64_t lo[2], hi[2];
	bool ok = false;
	struct wl wl;
	int err;

	if (skip_no_wp(name))
		return;
	err = wl_init(&wl, 8UL << 20, 2, false);
	if (!err)
		err = wl_start(&wl);
	r = (struct uffdwp_region){ wl.arena, wl.len };
	img = (struct uffdwp_region){ map(wl.len), wl.len };
	if (!err)
		err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = snap(ss, fds[0], 0, NULL);
	usleep(50000);
	wl_seqs(&wl, lo);
	if (!err)
		err = uffdwp_session_snapshot(ss, fds[1], 0);
	wl_seqs(&wl, hi);
	if (!err)
		err = uffdwp_session_wait(ss, 120000);
	if (!err)
		err = uffdwp_session_stats(ss, &s1);
	wl_stop(&wl);
	if (!err)
		err = load_chain(fds, 2, &img, 1, NULL);
	if (!err)
		ok = wl_verify(&wl, (const struct wl_rec *)img.addr, lo, hi, &res);
	uffdwp_session_free(ss);
	tap_check(!err && ok && s1.pages > 0, name,
		  "err %d, %s, delta of %llu of %zu pages (%llu faults)", err,
		  ok ? "verified" : res.why, (unsigned long long)s1.pages,
		  wl.len / psz, (unsigned long long)s1.faults);
	munmap(img.addr, img.len);
	wl_destroy(&wl);
	close(fds[0]);
	close(fds[1]);
}

/* ---- writes while a delta is being copied ---- */

/* Copies a pipe into a memfd until end of file. */
struct drain {
	pthread_t th;
	int in, out;
};

static void *drain_main(void *arg)
{
	struct drain *d = arg;
	char buf[16384];
	ssize_t n;

	while ((n = read(d->in, buf, sizeof(buf))) > 0)
		if (write(d->out, buf, (size_t)n) != n)
			break;
	return NULL;
}

/*
 * session-writes-during-delta{,-pipe}: the delta's copier is held before
 * its first chunk; the test writes three pages of the delta and one clean
 * page, then lets it go.  The delta must hold the three as they were at
 * its instant, and the next delta exactly the four new ones.  The pipe
 * variant (one-page cap) spills two of the three into the memfd.
 */
static void t_writes_during(bool pipe_sink)
{
	const char *name = pipe_sink ? "session-writes-during-delta-pipe" :
				       "session-writes-during-delta";
	size_t len = 32 * psz;
	char *p = map(len), *at1 = malloc(len), *img = map(len);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_session_opts o = { .side_cap = pipe_sink ? 1 : 0 };
	struct uffdwp_snapshot_stats s1 = { 0 }, s2 = { 0 };
	struct uffdwp_session *ss = NULL;
	int fds[3] = { new_file(), new_file(), new_file() };
	struct drain d = { .in = -1 };
	int pfd[2] = { -1, -1 }, err, e_img = -1;
	bool at1_ok = false, now_ok = false;

	if (skip_no_wp(name))
		return;
	fill(p, len, 3);
	err = uffdwp_session_new(&ss, &r, 1, &o);
	if (!err)
		err = snap(ss, fds[0], 0, NULL);
	for (int i = 4; i < 7; i++)		/* pages 4-6 go into delta 1 */
		p[i * psz] ^= 1;
	memcpy(at1, p, len);
	if (!err && pipe_sink) {
		err = pipe2(pfd, O_CLOEXEC) ? -errno : 0;
		d.in = pfd[0];
		d.out = fds[1];
		if (!err)
			pthread_create(&d.th, NULL, drain_main, &d);
	}
	gate_hold();
	if (!err)
		err = uffdwp_session_snapshot(ss, pipe_sink ? pfd[1] : fds[1], 0);
	if (!err) {
		for (int i = 4; i < 7; i++)	/* saved or spilled first */
			p[i * psz] ^= 2;
		p[20 * psz] ^= 2;		/* clean: only noted */
	}
	gate_remove();
	if (!err)
		err = uffdwp_session_wait(ss, 120000);
	if (!err)
		err = uffdwp_session_stats(ss, &s1);
	if (pipe_sink) {
		close(pfd[1]);
		if (d.in >= 0)
			pthread_join(d.th, NULL);
		close(pfd[0]);
	}
	if (!err)
		err = snap(ss, fds[2], 0, &s2);
	if (!err) {
		e_img = load_chain(fds, 2, &dst, 1, NULL);
		at1_ok = !e_img && !memcmp(img, at1, len);
		e_img = e_img ? e_img : load_chain(fds, 3, &dst, 1, NULL);
		now_ok = !e_img && !memcmp(img, p, len);
	}
	uffdwp_session_free(ss);
	tap_check(!err && at1_ok && now_ok && s1.pages == 3 &&
		  s1.saved + s1.spilled == 3 && (!pipe_sink || s1.spilled == 2) &&
		  s2.pages == 4, name,
		  "err %d, load %d, at delta 1 %s, now %s, delta 1 %llu pages (%llu saved, %llu spilled), delta 2 %llu pages (want 3, 4)",
		  err, e_img, at1_ok ? "same" : "differs",
		  now_ok ? "same" : "differs", (unsigned long long)s1.pages,
		  (unsigned long long)s1.saved, (unsigned long long)s1.spilled,
		  (unsigned long long)s2.pages);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	munmap(p, len);
	munmap(img, len);
	free(at1);
}

/* ---- discarded pages ---- */

/*
 * session-dontneed: a page discarded between snapshots reads as zeroes in
 * the next delta, and a write to it after that instant is in the one
 * after.
 */
static void t_dontneed(void)
{
	const char *name = "session-dontneed";
	size_t len = 16 * psz;
	char *p = map(len), *img = map(len);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_snapshot_stats s1 = { 0 }, s2 = { 0 };
	struct uffdwp_session *ss = NULL;
	int fds[3] = { new_file(), new_file(), new_file() };
	bool ok1 = false, ok2 = false;
	int err;

	if (skip_no_wp(name))
		return;
	fill(p, len, 4);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = snap(ss, fds[0], 0, NULL);
	if (!err && madvise(p + 5 * psz, psz, MADV_DONTNEED))
		err = -errno;
	if (!err)
		err = snap(ss, fds[1], 0, &s1);
	if (!err)
		ok1 = !load_chain(fds, 2, &dst, 1, NULL) && !memcmp(img, p, len) &&
		      !p[5 * psz];
	memset(p + 5 * psz, 0x77, 64);
	if (!err)
		err = snap(ss, fds[2], 0, &s2);
	if (!err)
		ok2 = !load_chain(fds, 3, &dst, 1, NULL) && !memcmp(img, p, len);
	uffdwp_session_free(ss);
	tap_check(!err && ok1 && ok2 && s1.pages == 1 && s2.pages == 1, name,
		  "err %d, after the discard %s (%llu pages), after the write %s (%llu pages)",
		  err, ok1 ? "same" : "differs", (unsigned long long)s1.pages,
		  ok2 ? "same" : "differs", (unsigned long long)s2.pages);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	munmap(p, len);
	munmap(img, len);
}

/*
 * session-discard-during: with UFFDWP_SNAP_DISCARD_FAIL, a page the held
 * copier has not copied is discarded: the snapshot fails with -EAGAIN
 * (its contents at the instant are gone), the writers are free, and the
 * next snapshot is a base that loads back right.
 */
static void t_discard_during(void)
{
	const char *name = "session-discard-during";
	size_t len = 16 * psz;
	char *p = map(len), *img = map(len);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_snapshot_info info = { 0 };
	struct uffdwp_session_opts o = { .flags = UFFDWP_SNAP_DISCARD_FAIL };
	struct uffdwp_session *ss = NULL;
	int fds[2] = { new_file(), new_file() };
	int err, failed = 0, e_load = -1;

	if (skip_no_wp(name))
		return;
	fill(p, len, 5);
	err = uffdwp_session_new(&ss, &r, 1, &o);
	gate_hold();
	if (!err)
		err = uffdwp_session_snapshot(ss, fds[0], 0);
	if (!err && madvise(p + 2 * psz, psz, MADV_DONTNEED))
		err = -errno;
	gate_remove();
	if (!err)
		failed = uffdwp_session_wait(ss, 120000);
	p[9 * psz] = 1;		/* not held: everything was let go */
	if (!err)
		err = snap(ss, fds[1], 0, NULL);
	if (!err) {
		e_load = load_chain(&fds[1], 1, &dst, 1, &info);
		lseek(fds[1], 0, SEEK_SET);
	}
	uffdwp_session_free(ss);
	tap_check(!err && failed == -EAGAIN && !e_load &&
		  info.kind == UFFDWP_FILE_BASE && !memcmp(img, p, len), name,
		  "err %d, the snapshot returned %d (want -EAGAIN), next: load %d, kind %u, data %s",
		  err, failed, e_load, info.kind,
		  memcmp(img, p, len) ? "differs" : "same");
	close(fds[0]);
	close(fds[1]);
	munmap(p, len);
	munmap(img, len);
}

/*
 * session-discard-zero: by default (private anonymous memory) a page the
 * held copier has not copied is discarded: the snapshot succeeds and
 * stores it as zeroes, every other page as it was; the next delta holds
 * the page (discarded counts as written) and loads back right.
 */
static void t_discard_zero(void)
{
	const char *name = "session-discard-zero";
	size_t len = 16 * psz;
	char *p = map(len), *img = map(len), *want = malloc(len);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_session *ss = NULL;
	int fds[2] = { new_file(), new_file() };
	int err, res = -1;
	bool first = false, second = false;

	if (skip_no_wp(name))
		return;
	fill(p, len, 6);
	memcpy(want, p, len);
	memset(want + 2 * psz, 0, psz);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	gate_hold();
	if (!err)
		err = uffdwp_session_snapshot(ss, fds[0], 0);
	if (!err && madvise(p + 2 * psz, psz, MADV_DONTNEED))
		err = -errno;
	gate_remove();
	if (!err)
		res = uffdwp_session_wait(ss, 120000);
	if (!err && !res) {
		first = !load_chain(fds, 1, &dst, 1, NULL) &&
			!memcmp(img, want, len);
		p[2 * psz] = 9;
		err = snap(ss, fds[1], 0, &st);
	}
	if (!err && !res)
		second = !load_chain(fds, 2, &dst, 1, NULL) &&
			 !memcmp(img, p, len);
	uffdwp_session_free(ss);
	tap_check(!err && !res && first && second && st.pages == 1, name,
		  "err %d, the snapshot returned %d (want 0), its file %s, the next delta (%llu pages, want 1) %s",
		  err, res, first ? "right" : "WRONG",
		  (unsigned long long)st.pages, second ? "right" : "WRONG");
	close(fds[0]);
	close(fds[1]);
	munmap(p, len);
	munmap(img, len);
	free(want);
}

/*
 * session-madvise-load: a base and three deltas of a 16 MiB arena (half
 * THP) while three writers write it and a thread gives parts of it back
 * (MADV_DONTNEED, MADV_FREE + MADV_PAGEOUT, MADV_PAGEOUT, MADV_COLD),
 * moves them (move_pages()) or forks, every 20 ms (issue #35, item 0):
 * every snapshot finishes in bounded time (a watchdog fails the case
 * rather than hang the run), and base + deltas load back as one instant
 * of the writers each time.
 */
static void t_madvise_load(void)
{
	const char *name = "session-madvise-load";
	char *img = malloc(MLOAD_LEN);
	struct uffdwp_session *ss = NULL;
	struct uffdwp_snapshot_stats st = { 0 };
	int fds[4] = { -1, -1, -1, -1 };
	const char *why = "";
	struct mload m;
	size_t bad = 0;
	int err, n = 0;

	if (skip_no_wp(name))
		return;
	/*
	 * One watchdog per step, not one for the case: a hang fails every
	 * kernel, while the debug lane's KASAN kernel, about 40 times slower
	 * under TCG, takes longer than 120 s for the four snapshots together.
	 */
	watchdog_arm(name, 120);
	err = mload_start(&m);
	if (!err) {
		struct uffdwp_region r = { m.arena, MLOAD_LEN };

		err = uffdwp_session_new(&ss, &r, 1, NULL);
	}
	watchdog_disarm();
	for (; !err && !bad && n < 4; n++) {
		struct uffdwp_region dst = { img, MLOAD_LEN };

		watchdog_arm(name, 120);
		usleep(50000);
		fds[n] = new_file();
		err = snap(ss, fds[n], 0, &st);
		if (!err)
			err = load_chain(fds, n + 1, &dst, 1, NULL);
		if (!err)
			bad = mload_check(img, &why);
		watchdog_disarm();
	}
	watchdog_arm(name, 120);
	uffdwp_session_free(ss);	/* writers still running */
	mload_stop(&m);
	watchdog_disarm();
	tap_check(!err && !bad && n == 4, name,
		  "snapshot %d: error %d, inconsistent at byte %zu (%s)", n, err,
		  bad ? bad - 1 : 0, why);
	tap_diag("madvise-load: %lu dontneed, %lu free+pageout, %lu pageout, %lu cold, %lu move_pages, %lu fork; last delta: %llu pages, pause %llu us",
		 m.ops[0], m.ops[1], m.ops[2], m.ops[3], m.ops[4], m.ops[5],
		 (unsigned long long)st.pages,
		 (unsigned long long)st.pause_ns / 1000);
	for (int i = 0; i < 4; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(img);
}

/*
 * session-fork-child-free: between two snapshots, a child of fork() frees
 * its copy of the session: it returns at once (its calls say -ECHILD), the
 * parent's pages stay protected, a write in the parent still goes through
 * the parent's handler, and the next delta holds exactly that page.  And a
 * sink descriptor that is not open is -EBADF.
 */
static struct uffdwp_session *fork_ss;

static void t_fork_child_free(void)
{
	const char *name = "session-fork-child-free";
	size_t len = 16 * psz;
	char *p = map(len), *img = map(len);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_snapshot_stats st = { 0 };
	int fds[2] = { new_file(), new_file() };
	int err, status = -1, badf = 0, closed;
	size_t still = 0;
	bool same = false;
	pid_t pid;

	if (skip_no_wp(name))
		return;
	fill(p, len, 31);
	watchdog_arm(name, 60);
	err = uffdwp_session_new(&fork_ss, &r, 1, NULL);
	if (!err)
		err = snap(fork_ss, fds[0], 0, NULL);
	if (!err) {
		pid = fork();
		if (pid == 0) {
			ssize_t d;

			alarm(10);
			d = uffdwp_session_dirty(fork_ss);
			uffdwp_session_free(fork_ss);
			_exit(d == -ECHILD ? 0 : 2);
		}
		if (pid < 0 || waitpid(pid, &status, 0) < 0)
			err = -errno;
		for (size_t i = 0; i < len / psz; i++)
			still += page_wp(p + i * psz);
	}
	if (!err) {
		p[3 * psz] = 5;
		err = snap(fork_ss, fds[1], 0, &st);
	}
	if (!err)
		same = !load_chain(fds, 2, &dst, 1, NULL) && !memcmp(img, p, len);
	closed = dup(fds[0]);
	close(closed);
	if (!err)
		badf = uffdwp_session_snapshot(fork_ss, closed, 0);
	uffdwp_session_free(fork_ss);
	watchdog_disarm();
	tap_check(!err && status == 0 && still == len / psz && st.pages == 1 &&
		  same && badf == -EBADF, name,
		  "err %d, child status %#x (want exit 0), %zu of %zu pages still protected, the next delta %llu pages (want 1), data %s; a closed fd: %d (want -EBADF)",
		  err, status, still, len / psz, (unsigned long long)st.pages,
		  same ? "same" : "differs", badf);
	close(fds[0]);
	close(fds[1]);
	munmap(p, len);
	munmap(img, len);
}

/* session-kernel-write: read(2) into a clean page is in the next delta. */
static void t_kernel_write(void)
{
	const char *name = "session-kernel-write";
	size_t len = 8 * psz;
	char *p = map(len), *img = map(len);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_snapshot_stats s0 = { 0 }, s1 = { 0 };
	struct uffdwp_session *ss = NULL;
	int fds[2] = { new_file(), new_file() }, pfd[2];
	ssize_t got = -1;
	bool ok = false;
	int err;

	if (skip_no_wp(name))
		return;
	fill(p, len, 6);
	err = pipe2(pfd, O_CLOEXEC) ? -errno : 0;
	if (!err)
		err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = snap(ss, fds[0], 0, &s0);
	if (!err && s0.user_mode_only) {
		tap_skip(name, "the session fell back to user-mode faults (no privilege for kernel-mode ones)");
		uffdwp_session_free(ss);
		goto out;
	}
	if (!err && write(pfd[1], "kernel", 6) == 6)
		got = read(pfd[0], p + 3 * psz + 10, 6);
	if (!err)
		err = snap(ss, fds[1], 0, &s1);
	if (!err)
		ok = !load_chain(fds, 2, &dst, 1, NULL) && !memcmp(img, p, len) &&
		     !memcmp(img + 3 * psz + 10, "kernel", 6);
	uffdwp_session_free(ss);
	tap_check(!err && got == 6 && ok && s1.pages == 1, name,
		  "err %d, read(2) %zd, delta %llu pages (want 1), image %s",
		  err, got, (unsigned long long)s1.pages, ok ? "same" : "differs");
out:
	close(pfd[0]);
	close(pfd[1]);
	close(fds[0]);
	close(fds[1]);
	munmap(p, len);
	munmap(img, len);
}

/*
 * session-thp: four PMD-mapped blocks; after the base one byte is written
 * in block 1 and in block 3.  The delta holds exactly those two blocks
 * (1024 pages: the handler unprotects a huge block whole), every block is
 * still PMD-mapped after the writes and after the delta's instant, and
 * base + delta is the memory.  Then block 2 is discarded whole (the zap
 * of a protected huge PMD): the next delta holds its 512 pages, as zeroes.
 */
static void t_thp(void)
{
	const char *name = "session-thp";
	size_t blocks = 4, len = blocks * HPAGE_SIZE;
	char *raw = mmap(NULL, len + HPAGE_SIZE, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *p = (char *)(((uintptr_t)raw + HPAGE_SIZE - 1) & ~(HPAGE_SIZE - 1));
	char *img = map(len);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_snapshot_stats s1 = { 0 }, s2 = { 0 };
	struct uffdwp_session *ss = NULL;
	int fds[3] = { new_file(), new_file(), new_file() };
	long before, written = -1, after = -1;
	bool same = false, zapped = false;
	int err;

	if (skip_no_wp(name))
		return;
	if (!f.thp) {
		tap_skip(name, "transparent hugepages are off");
		return;
	}
	madvise(p, len, MADV_HUGEPAGE);
	fill(p, len, 10);
	before = make_pmd_mapped(p, len);
	if (before != (long)blocks) {
		tap_skip(name, "the arena got %ld of %zu blocks PMD-mapped (%s)",
			 before, blocks, before < 0 ? strerror((int)-before) :
			 "no free huge page");
		goto out;
	}
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = snap(ss, fds[0], 0, NULL);
	p[1 * HPAGE_SIZE + 5 * psz] ^= 1;
	p[3 * HPAGE_SIZE + 100 * psz] ^= 1;
	written = pmd_mapped_blocks(p, len);
	if (!err)
		err = snap(ss, fds[1], 0, &s1);
	after = pmd_mapped_blocks(p, len);
	if (!err)
		same = !load_chain(fds, 2, &dst, 1, NULL) && !memcmp(img, p, len);
	if (!err && madvise(p + 2 * HPAGE_SIZE, HPAGE_SIZE, MADV_DONTNEED))
		err = -errno;
	if (!err)
		err = snap(ss, fds[2], 0, &s2);
	if (!err)
		zapped = !load_chain(fds, 3, &dst, 1, NULL) &&
			 !memcmp(img, p, len) && !p[2 * HPAGE_SIZE + 100];
	uffdwp_session_free(ss);
	tap_check(!err && same && zapped && s1.pages == 2 * HPAGE_SIZE / psz &&
		  s2.pages == HPAGE_SIZE / psz &&
		  s1.huge_blocks == blocks && written == (long)blocks &&
		  after == (long)blocks, name,
		  "err %d, image %s, delta %llu pages (want %lu), %llu huge blocks at its instant, PMD-mapped after the writes %ld, after the delta %ld (of %zu); after a block's discard: image %s, delta %llu pages (want %lu)",
		  err, same ? "same" : "differs", (unsigned long long)s1.pages,
		  2 * HPAGE_SIZE / psz, (unsigned long long)s1.huge_blocks,
		  written, after, blocks, zapped ? "same" : "differs",
		  (unsigned long long)s2.pages, HPAGE_SIZE / psz);
out:
	close(fds[0]);
	close(fds[1]);
	close(fds[2]);
	munmap(raw, len + HPAGE_SIZE);
	munmap(img, len);
}

/* ---- the tool ---- */

/* The uffdwp tool: $UFFDWP_TOOL, else beside this program (the guest's
 * /bin) or one directory up (build/host/tests -> build/host/uffdwp). */
static const char *find_tool(void)
{
	static char path[4200];
	char self[4096];
	ssize_t n;

	if (getenv("UFFDWP_TOOL"))
		return getenv("UFFDWP_TOOL");
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		char *slash;

		self[n] = 0;
		slash = strrchr(self, '/');
		if (slash) {
			*slash = 0;
			snprintf(path, sizeof(path), "%s/uffdwp", self);
			if (!access(path, X_OK))
				return path;
			snprintf(path, sizeof(path), "%s/../uffdwp", self);
			if (!access(path, X_OK))
				return path;
		}
	}
	return "/bin/uffdwp";
}

/* A restore case's start: TOOL there, and DIR made from its template
 * (mkdtemp); false (the case failed, saying why) when either is not. */
static bool restore_dir(const char *name, const char *tool, char *dir)
{
	if (access(tool, X_OK)) {
		tap_fail(name, "%s: %s (set UFFDWP_TOOL)", tool, strerror(errno));
		return false;
	}
	if (!mkdtemp(dir)) {
		tap_fail(name, "mkdtemp: %s", strerror(errno));
		return false;
	}
	return true;
}

/* A snapshot of SS into the new file DIR/I.snap (its name into PATH). */
static int snap_file(struct uffdwp_session *ss, const char *dir, int i,
		     char path[64])
{
	int fd, err;

	snprintf(path, 64, "%s/%d.snap", dir, i);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	err = fd < 0 ? -errno : snap(ss, fd, 0, NULL);
	if (fd >= 0)
		close(fd);
	return err;
}

/* `uffdwp restore --out OUT FILES...`: its exit status, and the image
 * read into IMG (up to LEN bytes; *GOT its length, -1 if none). */
static int run_restore(const char *tool, const char *out, char **files,
		       int n, char *img, size_t len, ssize_t *got)
{
	char *argv[8] = { (char *)tool, "restore", "--out", (char *)out };
	int status = -1, fd;
	pid_t pid;

	for (int i = 0; i < n && i < 3; i++)
		argv[4 + i] = files[i];
	*got = -1;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		execv(tool, argv);
		_exit(127);
	}
	if (pid > 0)
		waitpid(pid, &status, 0);
	fd = open(out, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		*got = read(fd, img, len);
		close(fd);
	}
	return status;
}

/* A restore case's end: its three snapshot files, OUT and DIR removed. */
static void restore_clean(const char *dir, char path[][64], const char *out)
{
	for (int i = 0; i < 3; i++)
		unlink(path[i]);
	unlink(out);
	rmdir(dir);
}

/* session-tool-restore: `uffdwp restore` rebuilds the image from a base
 * and two deltas written to files. */
static void t_tool_restore(void)
{
	const char *name = "session-tool-restore";
	const char *tool = find_tool();
	char dir[] = "/tmp/lib-session-XXXXXX", path[3][64] = { "" }, out[64];
	char *files[3] = { path[0], path[1], path[2] };
	size_t len = 24 * psz;
	char *p = map(len), *img = malloc(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_session *ss = NULL;
	ssize_t got = -1;
	int err = 0, status = -1;

	if (skip_no_wp(name) || !restore_dir(name, tool, dir))
		return;
	fill(p, len, 7);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	for (int i = 0; i < 3 && !err; i++) {
		err = snap_file(ss, dir, i, path[i]);
		p[(3 + 5 * i) * psz] ^= 0x11;
		p[(4 + 5 * i) * psz + 9] ^= 0x22;
	}
	uffdwp_session_free(ss);
	p[13 * psz] ^= 0x11;	/* undo the writes after the last instant */
	p[14 * psz + 9] ^= 0x22;
	snprintf(out, sizeof(out), "%s/image", dir);
	if (!err)
		status = run_restore(tool, out, files, 3, img, len, &got);
	tap_check(!err && WIFEXITED(status) && !WEXITSTATUS(status) &&
		  got == (ssize_t)len && !memcmp(img, p, len), name,
		  "err %d, %s restore: status %#x, image %zd bytes (want %zu), %s",
		  err, tool, status, got, len,
		  got == (ssize_t)len && !memcmp(img, p, len) ? "same" : "differs");
	restore_clean(dir, path, out);
	munmap(p, len);
	free(img);
}

/*
 * session-tool-restore-regions-changed: `uffdwp restore` follows the
 * regions: a base of A, a delta after B was added (the image is A and B
 * in address order), one after A was removed (the image is B alone),
 * each as the memory was at that instant.
 */
static void t_tool_restore_regions(void)
{
	const char *name = "session-tool-restore-regions-changed";
	const char *tool = find_tool();
	char dir[] = "/tmp/lib-session-XXXXXX", path[3][64] = { "" }, out[64];
	char *files[3] = { path[0], path[1], path[2] };
	size_t la = 16 * psz, lb = 8 * psz;
	char *a = map(la), *b = map(lb), *want2 = malloc(la + lb);
	char *want3 = malloc(lb), *img = malloc(la + lb + psz);
	struct uffdwp_region ra = { a, la }, rb = { b, lb };
	struct uffdwp_session *ss = NULL;
	ssize_t got2 = -1, got3 = -1;
	int err = 0, st2 = -1, st3 = -1;
	bool ok2 = false, ok3 = false;

	if (skip_no_wp(name) || !restore_dir(name, tool, dir))
		return;
	fill(a, la, 51);
	fill(b, lb, 52);
	err = uffdwp_session_new(&ss, &ra, 1, NULL);
	for (int i = 0; i < 3 && !err; i++) {
		if (i == 1)
			err = uffdwp_session_add_region(ss, &rb);
		if (i == 2)
			err = uffdwp_session_remove_region(ss, &ra);
		if (!err)
			err = snap_file(ss, dir, i, path[i]);
		if (i == 1) {
			memcpy(want2 + (a < b ? 0 : lb), a, la);
			memcpy(want2 + (a < b ? la : 0), b, lb);
		}
		a[(2 + i) * psz] ^= 0x11;
		b[(1 + i) * psz + 8] ^= 0x22;
	}
	uffdwp_session_free(ss);
	b[3 * psz + 8] ^= 0x22;	/* B as at the last instant */
	memcpy(want3, b, lb);
	snprintf(out, sizeof(out), "%s/image", dir);
	if (!err) {
		st2 = run_restore(tool, out, files, 2, img, la + lb + psz, &got2);
		ok2 = got2 == (ssize_t)(la + lb) && !memcmp(img, want2, la + lb);
		st3 = run_restore(tool, out, files, 3, img, la + lb + psz, &got3);
		ok3 = got3 == (ssize_t)lb && !memcmp(img, want3, lb);
	}
	tap_check(!err && WIFEXITED(st2) && !WEXITSTATUS(st2) && ok2 &&
		  WIFEXITED(st3) && !WEXITSTATUS(st3) && ok3, name,
		  "err %d; base + delta (B added): status %#x, %zd bytes (want %zu), %s; + delta (A removed): status %#x, %zd bytes (want %zu), %s",
		  err, st2, got2, la + lb, ok2 ? "same" : "differs", st3, got3,
		  lb, ok3 ? "same" : "differs");
	restore_clean(dir, path, out);
	munmap(a, la);
	munmap(b, lb);
	free(want2);
	free(want3);
	free(img);
}

/* ---- bad input ---- */

static void t_bad_input(void)
{
	size_t len = 4 * psz;
	char *p = map(len);
	struct uffdwp_region good = { p, len }, unaligned = { p + 1, len };
	struct uffdwp_session_opts flags = { .flags = 1u << 30 };
	struct uffdwp_session_opts modes = {
		.flags = UFFDWP_SNAP_KERNEL_FAULTS | UFFDWP_SNAP_USER_MODE_ONLY,
	};
	struct uffdwp_session_opts reserved = { .__reserved[5] = 1 };
	struct uffdwp_snapshot_stats st;
	struct uffdwp_session *ss = NULL, *busy = NULL;
	int e[9], i = 0, fd = new_file(), fd2 = new_file();
	int b_snap = 1, b_wait = 1, b_stats = 1, b_busy = 1;
	bool ok;

	if (skip_no_wp("session-bad-input") | skip_no_wp("session-busy"))
		return;
	e[i++] = uffdwp_session_new(NULL, &good, 1, NULL);
	e[i++] = uffdwp_session_new(&ss, NULL, 1, NULL);
	e[i++] = uffdwp_session_new(&ss, &unaligned, 1, NULL);
	e[i++] = uffdwp_session_new(&ss, &good, 1, &flags);
	e[i++] = uffdwp_session_new(&ss, &good, 1, &modes);
	e[i++] = uffdwp_session_new(&ss, &good, 1, &reserved);
	e[i++] = uffdwp_session_snapshot(NULL, fd, 0);
	e[i++] = uffdwp_session_wait(NULL, 0) == -EINVAL &&
		 uffdwp_session_stats(NULL, &st) == -EINVAL &&
		 uffdwp_session_dirty(NULL) == -EINVAL ? -EINVAL : 0;
	e[i++] = -EINVAL;
	uffdwp_session_free(NULL);
	ok = ss == NULL;
	if (!uffdwp_session_new(&busy, &good, 1, NULL)) {
		b_wait = uffdwp_session_wait(busy, 0);
		b_stats = uffdwp_session_stats(busy, &st);
		e[8] = uffdwp_session_snapshot(busy, -1, 0) == -EINVAL &&
		       uffdwp_session_snapshot(busy, fd, 1u << 7) == -EINVAL ?
		       -EINVAL : 0;
		gate_hold();
		b_snap = uffdwp_session_snapshot(busy, fd, 0);
		b_busy = uffdwp_session_snapshot(busy, fd2, 0);
		gate_remove();
		if (!b_snap)
			b_snap = uffdwp_session_wait(busy, 120000);
		uffdwp_session_free(busy);
	}
	for (int k = 0; k < i; k++)
		ok &= e[k] == -EINVAL;
	tap_check(ok, "session-bad-input",
		  "results %d %d %d %d %d %d %d %d %d (all must be -EINVAL)",
		  e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8]);
	tap_check(b_wait == -ENOENT && b_stats == -ENOENT && !b_snap &&
		  b_busy == -EBUSY, "session-busy",
		  "before any snapshot: wait %d, stats %d (want -ENOENT); a snapshot while one runs: %d (want -EBUSY), the first: %d",
		  b_wait, b_stats, b_busy, b_snap);
	close(fd);
	close(fd2);
	munmap(p, len);
}

/* Write LEN bytes of BUF to a new memfd, positioned at 0. */
static int file_of(const void *buf, size_t len)
{
	int fd = new_file();

	if (fd >= 0 && (write(fd, buf, len) != (ssize_t)len ||
			lseek(fd, 0, SEEK_SET)))
		return -1;
	return fd;
}

/* Load a copy of FILE (LEN bytes) changed by EDIT at OFF (NEWLEN bytes
 * kept), after PREV, into DST. */
static int load_edited(const char *file, size_t len, size_t newlen,
		       size_t off, const void *edit, size_t elen,
		       const struct uffdwp_snapshot_info *prev,
		       const struct uffdwp_region *dst, size_t nr)
{
	char *c = malloc(len);
	int fd, err;

	memcpy(c, file, len);
	if (edit)
		memcpy(c + off, edit, elen);
	fd = file_of(c, newlen);
	free(c);
	if (fd < 0)
		return -errno;
	err = uffdwp_snapshot_load(fd, dst, nr, prev, NULL);
	close(fd);
	return err;
}

/* load-bad-input / read-info: bad files and bad arguments. */

/* A base of a page that is read-only since, loaded where it was: -EFAULT
 * (unmapped, the library's own buffers could land there). */
static int load_unmapped(void)
{
	char *q = map(psz);
	struct uffdwp_region r = { q, psz };
	struct uffdwp_session *ss = NULL;
	int fd = new_file(), err;

	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = snap(ss, fd, 0, NULL);
	uffdwp_session_free(ss);
	mprotect(q, psz, PROT_READ);
	if (!err) {
		lseek(fd, 0, SEEK_SET);
		err = uffdwp_snapshot_load(fd, NULL, 0, NULL, NULL);
	}
	close(fd);
	return err;
}

static void t_load_bad(void)
{
	size_t len = 8 * psz, blen, dlen;
	char *p = map(len), *img = map(len), *base, *delta, junk[4096];
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_region short_dst = { img, len - psz }, two[2] = { dst, dst };
	struct uffdwp_region got[2] = { { 0 } };
	struct uffdwp_snapshot_info ib = { 0 }, id = { 0 }, other;
	struct uffdwp_session *ss = NULL;
	int fds[2] = { new_file(), new_file() }, pfd[2] = { -1, -1 };
	uint32_t bad_version = 4;	/* 3 is read since 0.4 */
	uint64_t bad_pages = 3;
	int e[16], i = 0, n_info = -1, n_max = -1, e_pipe = 0, err;
	bool ok;

	if (skip_no_wp("load-bad-input") | skip_no_wp("read-info"))
		return;
	fill(p, len, 8);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = snap(ss, fds[0], 0, NULL);
	p[psz] ^= 1;
	if (!err)
		err = snap(ss, fds[1], 0, NULL);
	uffdwp_session_free(ss);
	if (err) {
		tap_fail("load-bad-input", "setup: %d", err);
		tap_fail("read-info", "setup: %d", err);
		return;
	}
	blen = (size_t)lseek(fds[0], 0, SEEK_END);
	dlen = (size_t)lseek(fds[1], 0, SEEK_END);
	base = malloc(blen);
	delta = malloc(dlen);
	if (pread(fds[0], base, blen, 0) != (ssize_t)blen ||
	    pread(fds[1], delta, dlen, 0) != (ssize_t)dlen)
		tap_bail("reading the files back: %s", strerror(errno));
	lseek(fds[0], 0, SEEK_SET);
	lseek(fds[1], 0, SEEK_SET);
	n_info = uffdwp_snapshot_read_info(fds[0], &ib, got, 2);
	n_max = uffdwp_snapshot_read_info(fds[1], &id, got + 1, 0);
	ok = n_info == 1 && n_max == 1 && lseek(fds[0], 0, SEEK_CUR) == 0 &&
	     got[0].addr == p && got[0].len == len && ib.version == 2 &&
	     ib.page_size == (uint32_t)psz && ib.kind == UFFDWP_FILE_BASE &&
	     ib.nregions == 1 && ib.epoch == 0 && ib.pages_total == 8 &&
	     ib.pages == 8 && ib.file_len == blen &&
	     id.kind == UFFDWP_FILE_DELTA && id.epoch == 1 && id.pages == 1 &&
	     id.file_len == dlen && id.session == ib.session;
	if (!pipe2(pfd, O_CLOEXEC))
		e_pipe = uffdwp_snapshot_read_info(pfd[0], &other, NULL, 0);
	tap_check(ok && e_pipe == -ESPIPE &&
		  uffdwp_snapshot_read_info(fds[0], NULL, NULL, 0) == -EINVAL,
		  "read-info",
		  "regions %d/%d, base: v%u ps %u kind %u epoch %llu pages %llu/%llu len %llu (file %zu); delta: kind %u epoch %llu pages %llu; on a pipe %d (want -ESPIPE)",
		  n_info, n_max, ib.version, ib.page_size, ib.kind,
		  (unsigned long long)ib.epoch, (unsigned long long)ib.pages,
		  (unsigned long long)ib.pages_total,
		  (unsigned long long)ib.file_len, blen, id.kind,
		  (unsigned long long)id.epoch, (unsigned long long)id.pages,
		  e_pipe);

	memset(junk, 0x41, sizeof(junk));
	other = ib;
	other.session ^= 1;
	/* Not ours, truncated in the header, the regions, the pages. */
	e[i++] = load_edited(junk, sizeof(junk), sizeof(junk), 0, NULL, 0, NULL, &dst, 1);
	e[i++] = load_edited(base, blen, 40, 0, NULL, 0, NULL, &dst, 1);
	e[i++] = load_edited(base, blen, 70, 0, NULL, 0, NULL, &dst, 1);
	e[i++] = load_edited(base, blen, blen - 1, 0, NULL, 0, NULL, &dst, 1);
	/* Another format version; a page count the bitmap contradicts. */
	e[i++] = load_edited(base, blen, blen, 8, &bad_version, 4, NULL, &dst, 1);
	e[i++] = load_edited(base, blen, blen, 56, &bad_pages, 8, NULL, &dst, 1);
	/* A delta without its base, of another session, out of order. */
	e[i++] = load_edited(delta, dlen, dlen, 0, NULL, 0, NULL, &dst, 1);
	e[i++] = load_edited(delta, dlen, dlen, 0, NULL, 0, &other, &dst, 1);
	e[i++] = load_edited(delta, dlen, dlen, 0, NULL, 0, &id, &dst, 1);
	/* Destinations that do not fit; a recorded region not mapped. */
	e[i++] = load_edited(base, blen, blen, 0, NULL, 0, NULL, &short_dst, 1);
	e[i++] = load_edited(base, blen, blen, 0, NULL, 0, NULL, two, 2);
	e[i++] = load_edited(base, blen, blen, 0, NULL, 0, NULL, NULL, 1);
	e[i++] = load_edited(base, blen, blen, 0, NULL, 0, NULL, &dst, 0);
	/* (format 2: an edited address fails the prefix's checksum; a
	 * region unmapped since is the way to an unmapped destination) */
	e[i++] = load_unmapped();
	/* And the good ones still load. */
	e[i++] = load_edited(base, blen, blen, 0, NULL, 0, NULL, &dst, 1);
	e[i++] = load_edited(delta, dlen, dlen, 0, NULL, 0, &ib, &dst, 1);
	tap_check(e[0] == -EBADMSG && e[1] == -EBADMSG && e[2] == -EBADMSG &&
		  e[3] == -EBADMSG && e[4] == -EPROTONOSUPPORT &&
		  e[5] == -EBADMSG && e[6] == -ESTALE && e[7] == -ESTALE &&
		  e[8] == -ESTALE && e[9] == -EINVAL && e[10] == -EINVAL &&
		  e[11] == -EINVAL && e[12] == -EINVAL && e[13] == -EFAULT &&
		  !e[14] && !e[15] && !memcmp(img, p, len), "load-bad-input",
		  "junk %d, cut header %d, cut regions %d, cut pages %d, version %d, pages %d, delta alone %d, other session %d, same epoch %d, short dst %d, two dst %d, NULL dst %d, no nr %d, unmapped %d, good %d %d, data %s",
		  e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9],
		  e[10], e[11], e[12], e[13], e[14], e[15],
		  memcmp(img, p, len) ? "differs" : "same");
	if (pfd[0] >= 0) {
		close(pfd[0]);
		close(pfd[1]);
	}
	close(fds[0]);
	close(fds[1]);
	free(base);
	free(delta);
	munmap(p, len);
	munmap(img, len);
}

/* ---- the API of 0.4: completion fd, regions, dirty ranges, stats_v ---- */

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/*
 * session-fd: not readable before the first snapshot nor while one is
 * copied (the copier held at the gate), readable once it finished (and
 * after uffdwp_session_wait()), not readable again from the next
 * instant on; O_CLOEXEC; closed by uffdwp_session_free().
 */
static void t_session_fd(void)
{
	const char *name = "session-fd";
	size_t len = 64 * psz;
	char *p = map(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_session *ss = NULL;
	int f0 = new_file(), f1 = new_file(), fd = -1, cloexec = 0, closed;
	int before = -1, held = -1, done = -1, waited = -1, held2 = -1;
	int done2 = -1, err, e0 = -1, e1 = -1;

	if (skip_no_wp(name))
		return;
	fill(p, len, 31);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err) {
		fd = uffdwp_session_fd(ss);
		cloexec = fd >= 0 ? fcntl(fd, F_GETFD) & FD_CLOEXEC : 0;
		before = readable(fd, 0);
		gate_hold();
		err = uffdwp_session_snapshot(ss, f0, 0);
		held = readable(fd, 200);
		gate_open();
		done = readable(fd, 30000);
		e0 = uffdwp_session_wait(ss, 0);
		waited = readable(fd, 0);
		p[3 * psz] ^= 1;
		gate_hold();
		if (!err)
			err = uffdwp_session_snapshot(ss, f1, 0);
		held2 = readable(fd, 200);
		gate_open();
		done2 = readable(fd, 30000);
		e1 = uffdwp_session_wait(ss, 0);
		gate_remove();
	}
	uffdwp_session_free(ss);
	closed = fd >= 0 && fcntl(fd, F_GETFD) < 0 && errno == EBADF;
	tap_check(!err && fd >= 0 && cloexec && !before && !held && done &&
		  !e0 && waited && !held2 && done2 && !e1 && closed, name,
		  "err %d, fd %d (cloexec %d): before any snapshot %d, while held %d, done %d, wait %d then %d; next: held %d, done %d, wait %d; closed by free %d",
		  err, fd, !!cloexec, before, held, done, e0, waited, held2,
		  done2, e1, closed);
	close(f0);
	close(f1);
	munmap(p, len);
}

/*
 * session-add-remove: a session over A; B added after the base: the next
 * delta stores all of B and the written page of A, records both regions
 * and is marked UFFDWP_FILE_REGIONS_CHANGED (format 3); the one after it
 * is an ordinary delta.  B removed: its memory is writable without a
 * fault (no page of it write-protected, nothing dirty), and the next
 * delta records A alone (marked again) and stores only A's written page.
 * The chain loads back at the recorded addresses: A as at the last
 * instant, B as at the last instant it was in the session.
 */
static void t_add_remove(void)
{
	const char *name = "session-add-remove";
	size_t la = 16 * psz, lb = 8 * psz;
	char *a = map(la), *b = map(lb), *want_a = malloc(la), *want_b = malloc(lb);
	struct uffdwp_region ra = { a, la }, rb = { b, lb }, got[1];
	struct uffdwp_snapshot_info in[4] = { { 0 } };
	struct uffdwp_stats_v v = { .size = sizeof(v) };
	struct uffdwp_snapshot_stats st[4] = { { 0 } };
	struct uffdwp_session *ss = NULL;
	int fds[4] = { new_file(), new_file(), new_file(), new_file() };
	ssize_t d_add = -1, n_rng = -1, d_rm = -1;
	size_t wp_left = 1;
	int err, e_add = -1, e_rm = -1, e_v = -1, e_load = -1;
	bool ok_a = false, ok_b = false;

	if (skip_no_wp(name))
		return;
	fill(a, la, 41);
	fill(b, lb, 42);
	err = uffdwp_session_new(&ss, &ra, 1, NULL);
	if (!err)
		err = snap(ss, fds[0], 0, &st[0]);
	if (!err) {
		e_add = uffdwp_session_add_region(ss, &rb);
		d_add = uffdwp_session_dirty(ss);
		n_rng = uffdwp_session_dirty_ranges(ss, got, 1);
		a[3 * psz] ^= 1;
		err = e_add ? e_add : snap(ss, fds[1], 0, &st[1]);
	}
	if (!err) {
		b[2 * psz] ^= 1;
		a[5 * psz] ^= 1;
		err = snap(ss, fds[2], 0, &st[2]);
		memcpy(want_b, b, lb);
	}
	if (!err) {
		e_rm = uffdwp_session_remove_region(ss, &rb);
		/* Writable without a fault: nothing of B is protected, and
		 * the writes mark nothing. */
		for (size_t i = 0; i < lb; i += psz)
			b[i] ^= 0x7;
		wp_left = pages_with(b, lb, PM_UFFD_WP);
		d_rm = uffdwp_session_dirty(ss);
		a[7 * psz] ^= 1;
		err = e_rm ? e_rm : snap(ss, fds[3], 0, &st[3]);
		e_v = uffdwp_session_stats_v(ss, &v);
		memcpy(want_a, a, la);
	}
	for (int i = 0; !err && i < 4; i++) {
		lseek(fds[i], 0, SEEK_SET);
		if (uffdwp_snapshot_read_info(fds[i], &in[i], NULL, 0) < 0)
			err = -EBADMSG;
	}
	if (!err) {
		fill(a, la, 49);
		fill(b, lb, 49);
		e_load = load_chain(fds, 4, NULL, 0, NULL);
		ok_a = !memcmp(a, want_a, la);
		ok_b = !memcmp(b, want_b, lb);
	}
	uffdwp_session_free(ss);
	tap_check(!err && !e_add && d_add == 8 && n_rng == 1 &&
		  got[0].addr == b && got[0].len == lb &&
		  st[1].pages == 9 && in[1].nregions == 2 &&
		  in[1].flags == UFFDWP_FILE_REGIONS_CHANGED &&
		  in[1].version == 3 && in[0].version == 2 &&
		  st[2].pages == 2 && in[2].flags == 0 && in[2].version == 2 &&
		  !e_rm && wp_left == 0 && d_rm == 0 && st[3].pages == 1 &&
		  in[3].nregions == 1 && in[3].flags == UFFDWP_FILE_REGIONS_CHANGED &&
		  !e_v && v.nregions == 1 && v.region_pages == la / psz &&
		  !e_load && ok_a && ok_b, name,
		  "err %d; add %d: dirty %zd (want 8), ranges %zd; delta stores %llu (want 9), %u regions, flags %#x, version %u; next %llu pages, flags %#x; remove %d: %zu pages still protected, dirty %zd; last delta %llu pages, %u regions, flags %#x; stats_v %d (%llu regions); load %d, A %s, B %s",
		  err, e_add, d_add, n_rng, (unsigned long long)st[1].pages,
		  in[1].nregions, in[1].flags, in[1].version,
		  (unsigned long long)st[2].pages, in[2].flags, e_rm, wp_left,
		  d_rm, (unsigned long long)st[3].pages, in[3].nregions,
		  in[3].flags, e_v, (unsigned long long)v.nregions, e_load,
		  ok_a ? "same" : "differs", ok_b ? "same" : "differs");
	for (int i = 0; i < 4; i++)
		close(fds[i]);
	free(want_a);
	free(want_b);
	munmap(a, la);
	munmap(b, lb);
}

/*
 * session-regions-bad-input: adding NULL, unaligned, empty, overlapping
 * (-EBUSY), unmapped (-EFAULT), PROT_NONE or read-only (-EINVAL) memory,
 * memory another session holds (-EBUSY); removing what is not a region
 * (-ENOENT) or the only one (-EINVAL); either while a snapshot is copied
 * (-EBUSY).  The session goes on unchanged.
 */
static void t_regions_bad(void)
{
	const char *name = "session-regions-bad-input";
	size_t len = 8 * psz;
	char *a = map(len), *b = map(len), *c = map(len), *gone = map(len);
	char *none = map(len), *ro = map(len), *d = map(len);
	struct uffdwp_region ra = { a, len }, rb = { b, len }, rc = { c, len };
	struct uffdwp_region rd = { d, len };
	struct uffdwp_region bad[] = {
		{ a + 1, psz }, { b, 0 }, { a + psz, psz }, { gone, len },
		{ none, len }, { ro, len }, { c, len }, { a, psz },
	};
	const int want[] = { -EINVAL, -EINVAL, -EBUSY, -EFAULT, -EINVAL,
			     -EINVAL, -EBUSY, -ENOENT };
	struct uffdwp_session *ss = NULL, *other = NULL;
	struct uffdwp_snapshot_stats st = { 0 };
	int e[12], n = 0, err, f0 = new_file(), f1 = new_file(), e_b = -1;
	bool ok = true;

	if (skip_no_wp(name))
		return;
	mprotect(none, len, PROT_NONE);
	mprotect(ro, len, PROT_READ);
	err = uffdwp_session_new(&ss, &ra, 1, NULL);
	if (!err)
		err = uffdwp_session_new(&other, &rc, 1, NULL);
	if (!err) {
		e[n++] = uffdwp_session_add_region(ss, NULL);
		for (int i = 0; i < 7; i++) {
			/* Unmapped just before: nothing maps the hole (the
			 * library checks before it allocates). */
			if (bad[i].addr == gone)
				munmap(gone, len);
			e[n++] = uffdwp_session_add_region(ss, &bad[i]);
		}
		e[n++] = uffdwp_session_remove_region(ss, &bad[7]);
		e[n++] = uffdwp_session_remove_region(ss, &ra);
		e_b = uffdwp_session_add_region(ss, &rb);
		gate_hold();
		err = uffdwp_session_snapshot(ss, f0, 0);
		e[n++] = uffdwp_session_add_region(ss, &rd);
		e[n++] = uffdwp_session_remove_region(ss, &rb);
		gate_remove();
		if (!err)
			err = uffdwp_session_wait(ss, 120000);
		a[psz] ^= 1;
		if (!err)
			err = snap(ss, f1, 0, &st);
	}
	uffdwp_session_free(other);
	uffdwp_session_free(ss);
	ok = !err && n == 12 && e[0] == -EINVAL && !e_b && st.pages == 1;
	for (int i = 0; ok && i < 7; i++)
		ok = e[1 + i] == want[i];
	ok = ok && e[8] == -ENOENT && e[9] == -EINVAL && e[10] == -EBUSY &&
	     e[11] == -EBUSY;
	tap_check(ok, name,
		  "err %d, add %d; add NULL %d, unaligned %d, empty %d, overlapping %d, unmapped %d, PROT_NONE %d, read-only %d, another session's %d; remove not a region %d, the only one %d; while copying: add %d, remove %d; then a delta of %llu pages (want 1)",
		  err, e_b, e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7],
		  e[8], e[9], e[10], e[11], (unsigned long long)st.pages);
	close(f0);
	close(f1);
	munmap(a, len);
	munmap(b, len);
	munmap(c, len);
	munmap(none, len);
	munmap(ro, len);
	munmap(d, len);
}

/*
 * session-dirty-ranges: the pages written since the last instant as runs
 * in address order, one run across a 64-page word of the bitmap, runs
 * ending at a region's end, never across regions; the count alone with
 * NULL and 0, the first MAX stored when more; nothing after a snapshot.
 */
static void t_dirty_ranges(void)
{
	const char *name = "session-dirty-ranges";
	size_t la = 160 * psz, lb = 8 * psz;
	char *a = map(la), *b = map(lb);
	struct uffdwp_region r[2] = { { a, la }, { b, lb } }, got[8], two[2];
	struct uffdwp_region want[8];
	struct uffdwp_session *ss = NULL;
	static const int runs_a[][2] = { { 3, 3 }, { 60, 11 }, { 159, 1 } };
	int f0 = new_file(), f1 = new_file(), nw = 0, err;
	ssize_t count = -1, n = -1, n2 = -1, after = -1, pages = -1;
	bool ok = false;

	if (skip_no_wp(name))
		return;
	err = uffdwp_session_new(&ss, r, 2, NULL);
	if (!err)
		err = snap(ss, f0, 0, NULL);
	if (!err) {
		for (int k = 0; k < 3; k++)
			for (int i = 0; i < runs_a[k][1]; i++)
				a[(runs_a[k][0] + i) * psz] ^= 1;
		b[0] ^= 1;
		b[psz] ^= 1;
		/* B's run and A's, in address order. */
		if (b < a)
			want[nw++] = (struct uffdwp_region){ b, 2 * psz };
		for (int k = 0; k < 3; k++)
			want[nw++] = (struct uffdwp_region){
				a + runs_a[k][0] * psz, runs_a[k][1] * psz };
		if (b > a)
			want[nw++] = (struct uffdwp_region){ b, 2 * psz };
		count = uffdwp_session_dirty_ranges(ss, NULL, 0);
		n = uffdwp_session_dirty_ranges(ss, got, 8);
		n2 = uffdwp_session_dirty_ranges(ss, two, 2);
		pages = uffdwp_session_dirty(ss);
		err = snap(ss, f1, 0, NULL);
		after = uffdwp_session_dirty_ranges(ss, got + 4, 4);
	}
	uffdwp_session_free(ss);
	ok = !err && count == 4 && n == 4 && n2 == 4 && after == 0 &&
	     pages == 17 && !memcmp(got, want, 4 * sizeof(*got)) &&
	     !memcmp(two, want, 2 * sizeof(*two));
	tap_check(ok, name,
		  "err %d: count %zd, ranges %zd, into 2: %zd (want 4 each), pages %zd (want 17), after a snapshot %zd; first %p+%zu (want %p+%zu)",
		  err, count, n, n2, pages, after, got[0].addr, got[0].len,
		  want[0].addr, want[0].len);
	close(f0);
	close(f1);
	munmap(a, la);
	munmap(b, lb);
}

/*
 * session-stats-v: -ENOENT before a snapshot; then what
 * uffdwp_session_stats() says, and the session's regions and dirty
 * pages; a caller's smaller struct filled to its size (the bytes past it
 * untouched), a larger one zeroed past the library's and told its size;
 * sizes below 8, not a multiple of 8 or above 4096 refused.
 */
static void t_stats_v(void)
{
	const char *name = "session-stats-v";
	size_t len = 32 * psz;
	char *p = map(len);
	struct uffdwp_region r = { p, len };
	struct uffdwp_session *ss = NULL;
	struct uffdwp_snapshot_stats st = { 0 };
	struct {
		struct uffdwp_stats_v v;
		uint64_t more[8];
	} big;
	struct uffdwp_stats_v v, small;
	int f0 = new_file(), err, e_none = -1, e_big = -1, e_small = -1;
	int e_bad[4] = { 0 };
	bool big_ok = false, small_ok = false;

	if (skip_no_wp(name))
		return;
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err) {
		v.size = sizeof(v);
		e_none = uffdwp_session_stats_v(ss, &v);
		err = snap(ss, f0, 0, &st);
		p[0] ^= 1;
		p[9 * psz] ^= 1;
	}
	/* (faults go on being counted between snapshots) */
	if (!err)
		err = uffdwp_session_stats(ss, &st);
	if (!err) {
		memset(&big, 0xA5, sizeof(big));
		big.v.size = sizeof(big);
		e_big = uffdwp_session_stats_v(ss, &big.v);
		big_ok = big.v.size == sizeof(big.v) && big.more[0] == 0 &&
			 big.more[7] == 0 && big.v.pages == st.pages &&
			 big.v.epoch == st.epoch && big.v.faults == st.faults &&
			 big.v.pause_ns == st.pause_ns &&
			 big.v.error == st.error &&
			 (big.v.flags & UFFDWP_STATS_DONE) &&
			 big.v.nregions == 1 && big.v.region_pages == len / psz &&
			 big.v.dirty_pages == 2;
		memset(&small, 0xA5, sizeof(small));
		small.size = 16;
		e_small = uffdwp_session_stats_v(ss, &small);
		small_ok = small.size == 16 && (small.flags & UFFDWP_STATS_DONE) &&
			   small.error == 0 && small.pause_ns == 0xA5A5A5A5A5A5A5A5ULL;
		v.size = 0;
		e_bad[0] = uffdwp_session_stats_v(ss, &v);
		v.size = 4;
		e_bad[1] = uffdwp_session_stats_v(ss, &v);
		v.size = 20;
		e_bad[2] = uffdwp_session_stats_v(ss, &v);
		v.size = 8192;
		e_bad[3] = uffdwp_session_stats_v(ss, &v);
	}
	uffdwp_session_free(ss);
	tap_check(!err && e_none == -ENOENT && !e_big && big_ok && !e_small &&
		  small_ok && e_bad[0] == -EINVAL && e_bad[1] == -EINVAL &&
		  e_bad[2] == -EINVAL && e_bad[3] == -EINVAL, name,
		  "err %d; before a snapshot %d (want -ENOENT); larger %d (%s, size %u), smaller %d (%s); sizes 0, 4, 20, 8192: %d %d %d %d",
		  err, e_none, e_big, big_ok ? "right" : "WRONG", big.v.size,
		  e_small, small_ok ? "right" : "WRONG", e_bad[0], e_bad[1],
		  e_bad[2], e_bad[3]);
	close(f0);
	munmap(p, len);
}

int main(void)
{
	psz = sysconf(_SC_PAGESIZE);
	tap_plan(22);
	uffdwp_probe(&f);
	t_base_delta();
	t_concurrent();
	t_writes_during(false);
	t_writes_during(true);
	t_dontneed();
	t_discard_during();
	t_discard_zero();
	t_madvise_load();
	t_fork_child_free();
	t_kernel_write();
	t_thp();
	t_tool_restore();
	t_bad_input();
	t_load_bad();
	t_session_fd();
	t_add_remove();
	t_regions_bad();
	t_dirty_ranges();
	t_stats_v();
	t_tool_restore_regions();
	return tap_done();
}
