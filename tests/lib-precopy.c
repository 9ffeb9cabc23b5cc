// SPDX-License-Identifier: GPL-2.0
/*
 * lib-precopy: uffdwp_session_precopy(), a session's base taken with
 * pre-copy rounds (async WP and the ring) and a short sync instant.
 *  - precopy-exact: with nothing written, the file is a base holding every
 *    page byte for byte, the rounds wrote them all and the instant's set
 *    is empty;
 *  - precopy-writers / -writers-thp: with writers running through the
 *    rounds, base = the memory at the instant, record by record
 *    (workload/workload.c), on 4 KiB pages and on PMD-mapped THPs;
 *  - precopy-overflow: the same with a ring far smaller than what the
 *    rounds see written (vm.uffd_ring_max_entries lowered), so that rounds
 *    and instant fall back to PAGEMAP_SCAN;
 *  - precopy-then-delta: the session goes on after a pre-copy: a delta
 *    holds exactly the pages written after its instant, and base + delta
 *    load back byte for byte; a second pre-copy works too;
 *  - precopy-discard-during-rounds: a whole PMD-mapped block and some 4 KiB
 *    pages discarded after round 0 copied them read as zeroes in the file
 *    (the zaps are in the ring);
 *  - precopy-enospc: a file that fills up during the rounds fails the
 *    pre-copy with -ENOSPC; the session goes on in sync mode (a write
 *    after the failure is seen) and its next snapshot is an exact base;
 *  - precopy-madvise-load: a pre-copy base and a delta under issue #35's
 *    load (writers, and discards, pageouts, move_pages() and fork() every
 *    20 ms): each finishes (a watchdog fails the case rather than hang)
 *    and loads back as one instant of the writers;
 *  - precopy-bad-input: -EINVAL (NULL, fd, flags, reserved, a pipe, an
 *    O_APPEND file), -EOPNOTSUPP (a session without WP on unpopulated
 *    pages), -EBUSY (a snapshot still running).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tap.h"
#include "lib_test.h"
#include "uffd_util.h"
#include "uffdwp.h"
#include "workload.h"

static long psz;

static bool skip_no_precopy(const char *name)
{
	if (skip_no_wp(name))
		return true;
	if (f.set_mode && f.wp_ring && f.wp_unpopulated)
		return false;
	tap_skip(name, "kernel has no UFFDIO_SET_MODE or write-log ring (features: set_mode %d, wp_ring %d)",
		 f.set_mode, f.wp_ring);
	return true;
}

static int precopy(struct uffdwp_session *ss, int fd,
		   struct uffdwp_snapshot_stats *st)
{
	int err = uffdwp_session_precopy(ss, fd, NULL);

	if (!err)
		err = uffdwp_session_wait(ss, 300000);
	if (!err && st)
		err = uffdwp_session_stats(ss, st);
	return err;
}

static void t_exact(void)
{
	const char *name = "precopy-exact";
	size_t len = 4UL << 20;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *img = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_snapshot_info info = { 0 };
	struct uffdwp_session *ss = NULL;
	int fd = memfd_create("snap", MFD_CLOEXEC), err;

	if (skip_no_precopy(name) || p == MAP_FAILED || img == MAP_FAILED)
		goto out;
	fill(p, len - len / 4, 7);	/* the last quarter never touched */
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = precopy(ss, fd, &st);
	if (!err)
		err = load_chain(&fd, 1, &dst, 1, &info);
	tap_check(!err && !memcmp(img, p, len) &&
		  info.kind == UFFDWP_FILE_BASE &&
		  info.pages == len / psz && st.pages == len / psz &&
		  st.precopy_rounds >= 2 && st.precopy_pages >= len / psz &&
		  st.pages_copied == 0, name,
		  "err %d, %s, kind %u, %llu pages in the file (stats %llu), %llu rounds wrote %llu, the instant %llu",
		  err, memcmp(img, p, len) ? "differs" : "same",
		  info.kind, (unsigned long long)info.pages,
		  (unsigned long long)st.pages,
		  (unsigned long long)st.precopy_rounds,
		  (unsigned long long)st.precopy_pages,
		  (unsigned long long)st.pages_copied);
out:
	uffdwp_session_free(ss);
	close(fd);
	munmap(p, len);
	munmap(img, len);
}

/* Pre-copy of a running workload, checked record by record. */
static void t_writers(const char *name, bool thp, size_t len)
{
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_session *ss = NULL;
	struct wl_result res = { 0 };
	struct uffdwp_region r, img = { 0 };
	int fd = memfd_create("snap", MFD_CLOEXEC), err;
	uint64_t lo[2], hi[2];
	bool ok = false;
	long blocks = 0;
	struct wl wl;

	if (skip_no_precopy(name)) {
		close(fd);
		return;
	}
	err = wl_init(&wl, len, 2, thp);
	if (err) {
		tap_fail(name, "wl_init: %d", err);
		close(fd);
		return;
	}
	if (thp && (blocks = make_pmd_mapped((char *)wl.arena, wl.len)) <= 0) {
		tap_skip(name, "no PMD-mapped THP in the arena after compaction (%ld)",
			 blocks);
		goto out;
	}
	err = wl_start(&wl);
	r = (struct uffdwp_region){ wl.arena, wl.len };
	img = (struct uffdwp_region){ mmap(NULL, wl.len, PROT_READ | PROT_WRITE,
					   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
				      wl.len };
	if (!err)
		err = uffdwp_session_new(&ss, &r, 1, NULL);
	wl_seqs(&wl, lo);
	if (!err)
		err = uffdwp_session_precopy(ss, fd, NULL);
	wl_seqs(&wl, hi);
	if (!err)
		err = uffdwp_session_wait(ss, 300000);
	if (!err)
		err = uffdwp_session_stats(ss, &st);
	wl_stop(&wl);
	if (!err)
		err = load_chain(&fd, 1, &img, 1, NULL);
	if (!err)
		ok = wl_verify(&wl, (const struct wl_rec *)img.addr, lo, hi,
			       &res);
	tap_diag("%s: %llu rounds wrote %llu pages; the instant protected %llu (pause %llu us), %llu faults",
		 name, (unsigned long long)st.precopy_rounds,
		 (unsigned long long)st.precopy_pages,
		 (unsigned long long)st.pages_copied,
		 (unsigned long long)st.pause_ns / 1000,
		 (unsigned long long)st.faults);
	tap_check(!err && ok && st.precopy_pages >= wl.len / psz &&
		  st.pages == wl.len / psz, name, "err %d, %s", err,
		  ok ? "verified" : res.why);
out:
	uffdwp_session_free(ss);
	if (img.addr)
		munmap(img.addr, img.len);
	wl_destroy(&wl);
	close(fd);
}

static void t_overflow(void)
{
	const char *name = "precopy-overflow";
	const char *knob = "/proc/sys/vm/uffd_ring_max_entries";
	char old[32] = "";
	int fd, err;
	ssize_t n;

	if (skip_no_precopy(name))
		return;
	fd = open(knob, O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, old, sizeof(old) - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0 || (err = write_knob(knob, "64"))) {
		tap_skip(name, "cannot lower %s", knob);
		return;
	}
	/* the session's ring now has 64 entries for 4096 pages */
	t_writers(name, false, 16UL << 20);
	err = write_knob(knob, old);
	if (err)
		tap_diag("could not restore %s: %d", knob, err);
}

static void t_then_delta(void)
{
	const char *name = "precopy-then-delta";
	size_t len = 2UL << 20;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *img = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_snapshot_stats st = { 0 };
	struct uffdwp_session *ss = NULL;
	int fds[3] = { memfd_create("a", MFD_CLOEXEC),
		       memfd_create("b", MFD_CLOEXEC),
		       memfd_create("c", MFD_CLOEXEC) };
	ssize_t dirty = -1;
	int err;
	bool same1 = false, same2 = false;

	if (skip_no_precopy(name))
		goto out;
	fill(p, len, 3);
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = precopy(ss, fds[0], NULL);
	for (int i = 0; !err && i < 5; i++)
		p[(size_t)(i * 97 % (len / psz)) * psz + 8] ^= 0x5a;
	if (!err)
		dirty = uffdwp_session_dirty(ss);
	if (!err) {
		err = uffdwp_session_snapshot(ss, fds[1], 0);
		if (!err)
			err = uffdwp_session_wait(ss, 120000);
		if (!err)
			err = uffdwp_session_stats(ss, &st);
	}
	if (!err)
		same1 = !load_chain(fds, 2, &dst, 1, NULL) &&
			!memcmp(img, p, len);
	/* a second pre-copy, a base again, after more writes */
	if (!err) {
		fill(p, len / 2, 4);
		err = precopy(ss, fds[2], NULL);
	}
	if (!err) {
		memset(img, 0, len);
		same2 = !load_chain(&fds[2], 1, &dst, 1, NULL) &&
			!memcmp(img, p, len);
	}
	tap_check(!err && dirty == 5 && st.pages == 5 && same1 && same2,
		  name, "err %d, %zd dirty, delta of %llu pages, base+delta %s, second pre-copy %s",
		  err, dirty, (unsigned long long)st.pages,
		  same1 ? "same" : "differs", same2 ? "same" : "differs");
out:
	uffdwp_session_free(ss);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	munmap(p, len);
	munmap(img, len);
}

static void t_bad_input(void)
{
	const char *name = "precopy-bad-input";
	size_t len = 1UL << 20;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { p, len };
	struct uffdwp_session_opts no_unpop = {
		.flags = UFFDWP_SNAP_NO_UNPOPULATED,
	};
	struct uffdwp_precopy_opts o = { 0 };
	struct uffdwp_session *ss = NULL;
	int fd = memfd_create("snap", MFD_CLOEXEC);
	int other = memfd_create("other", MFD_CLOEXEC);
	int pfd[2] = { -1, -1 }, app = -1, e[9] = { 0 };
	char path[] = "/tmp/precopy-XXXXXX";

	if (skip_no_precopy(name))
		goto out;
	memset(p, 1, len);
	if (uffdwp_session_new(&ss, &r, 1, NULL) || pipe(pfd)) {
		tap_fail(name, "setup failed");
		goto out;
	}
	app = mkstemp(path);
	if (app >= 0) {
		unlink(path);
		fcntl(app, F_SETFL, O_APPEND);
	}
	e[0] = uffdwp_session_precopy(NULL, fd, NULL);
	e[1] = uffdwp_session_precopy(ss, -1, NULL);
	o.flags = 1;
	e[2] = uffdwp_session_precopy(ss, fd, &o);
	o.flags = 0;
	o.__reserved[5] = 1;
	e[3] = uffdwp_session_precopy(ss, fd, &o);
	e[4] = uffdwp_session_precopy(ss, pfd[1], NULL);
	e[5] = app >= 0 ? uffdwp_session_precopy(ss, app, NULL) : -ENOENT;
	/* a snapshot whose copier waits at the gate is still running */
	gate_hold();
	e[6] = uffdwp_session_snapshot(ss, other, 0);
	if (!e[6])
		e[6] = uffdwp_session_precopy(ss, fd, NULL);
	gate_remove();
	uffdwp_session_wait(ss, 120000);
	uffdwp_session_free(ss);
	ss = NULL;
	/* a session that may not use WP on unpopulated pages */
	e[7] = uffdwp_session_new(&ss, &r, 1, &no_unpop);
	e[8] = e[7] ? e[7] : uffdwp_session_precopy(ss, fd, NULL);
	tap_check(e[0] == -EINVAL && e[1] == -EINVAL && e[2] == -EINVAL &&
		  e[3] == -EINVAL && e[4] == -EINVAL && e[5] == -EINVAL &&
		  e[6] == -EBUSY && !e[7] && e[8] == -EOPNOTSUPP, name,
		  "NULL %d, fd -1 %d, flags %d, reserved %d, pipe %d, O_APPEND %d, busy %d, NO_UNPOPULATED %d/%d",
		  e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8]);
out:
	uffdwp_session_free(ss);
	if (app >= 0)
		close(app);
	if (pfd[0] >= 0)
		close(pfd[0]);
	if (pfd[1] >= 0)
		close(pfd[1]);
	close(fd);
	close(other);
	munmap(p, len);
}

/* libuffdwp's test seam (lib/internal.h): after each pre-copy round. */
extern void (*uw_precopy_after_round)(uint64_t round);

static char *discard_at;

/* After round 0 wrote them: a whole 2 MiB block and 8 pages of the next
 * are discarded, as MADV_DONTNEED would while the program runs. */
static void discard_after_round0(uint64_t round)
{
	if (round)
		return;
	madvise(discard_at, HPAGE_SIZE, MADV_DONTNEED);
	madvise(discard_at + HPAGE_SIZE + 40 * psz, 8 * psz, MADV_DONTNEED);
}

/*
 * Pages discarded after round 0 copied them (the kernel logs the zap of a
 * protected page, and of a huge PMD, in the ring): the file must hold
 * zeroes there.  Fails if the discards are missed: the file then keeps
 * round 0's contents.
 */
static void t_discard(void)
{
	const char *name = "precopy-discard-during-rounds";
	size_t len = 2 * HPAGE_SIZE;
	char *p = map_anon_aligned(len, HPAGE_SIZE);
	char *img = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_session *ss = NULL;
	int fd = memfd_create("snap", MFD_CLOEXEC), err;
	long blocks;

	if (skip_no_precopy(name) || !p || img == MAP_FAILED)
		goto out;
	madvise(p, len, MADV_HUGEPAGE);
	fill(p, len, 5);
	blocks = make_pmd_mapped(p, len);
	tap_diag("%s: %ld of 2 blocks PMD-mapped (a whole one is zapped as a huge PMD)",
		 name, blocks);
	discard_at = p;
	uw_precopy_after_round = discard_after_round0;
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (!err)
		err = precopy(ss, fd, NULL);
	uw_precopy_after_round = NULL;
	if (!err)
		err = load_chain(&fd, 1, &dst, 1, NULL);
	tap_check(!err && !memcmp(img, p, len) && !p[0] &&
		  !p[HPAGE_SIZE + 40 * psz], name,
		  "err %d, image %s memory (first difference at %ld)", err,
		  memcmp(img, p, len) ? "differs from" : "equals",
		  first_diff(img, p, len));
out:
	uffdwp_session_free(ss);
	close(fd);
	if (p)
		munmap(p, len);
	munmap(img, len);
}

/* A sink that fills up during the rounds: the error, then the session
 * still works, in sync mode, and its next snapshot is a full base. */
static void t_enospc(void)
{
	const char *name = "precopy-enospc";
	const char *dir = "/tmp/precopy-full";
	size_t len = 1UL << 20;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *img = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { p, len }, dst = { img, len };
	struct uffdwp_snapshot_info info = { 0 };
	struct uffdwp_session *ss = NULL;
	int fd = -1, mem = memfd_create("snap", MFD_CLOEXEC), e1 = 0, e2 = 0;
	ssize_t dirty = -1;

	if (skip_no_precopy(name))
		goto out;
	mkdir(dir, 0700);
	if (mount("none", dir, "tmpfs", 0, "size=256k")) {
		tap_skip(name, "cannot mount a small tmpfs on %s: %s", dir,
			 strerror(errno));
		goto out;
	}
	fd = open("/tmp/precopy-full/snap", O_RDWR | O_CREAT | O_CLOEXEC,
		  0600);
	fill(p, len, 9);
	e1 = fd < 0 ? -errno : uffdwp_session_new(&ss, &r, 1, NULL);
	if (!e1)
		e1 = uffdwp_session_precopy(ss, fd, NULL);
	p[3 * psz] ^= 1;	/* a write after the failure: sync mode again */
	dirty = ss ? uffdwp_session_dirty(ss) : -1;
	if (ss) {
		e2 = uffdwp_session_snapshot(ss, mem, 0);
		if (!e2)
			e2 = uffdwp_session_wait(ss, 120000);
		if (!e2)
			e2 = load_chain(&mem, 1, &dst, 1, &info);
	}
	tap_check(e1 == -ENOSPC && dirty == 1 && !e2 &&
		  info.kind == UFFDWP_FILE_BASE && !memcmp(img, p, len), name,
		  "pre-copy %d (expected %d), the handler saw %zd write(s) after it (expected 1), then a snapshot %d, kind %u, %s",
		  e1, -ENOSPC, dirty, e2, info.kind,
		  memcmp(img, p, len) ? "differs" : "same");
out:
	uffdwp_session_free(ss);
	if (fd >= 0)
		close(fd);
	umount(dir);
	rmdir(dir);
	close(mem);
	munmap(p, len);
	munmap(img, len);
}

static void t_madvise_load(void)
{
	const char *name = "precopy-madvise-load";
	char *img = malloc(MLOAD_LEN);
	struct uffdwp_session *ss = NULL;
	struct uffdwp_snapshot_stats st = { 0 };
	int fds[2] = { memfd_create("base", MFD_CLOEXEC),
		       memfd_create("delta", MFD_CLOEXEC) };
	struct uffdwp_region dst = { img, MLOAD_LEN };
	const char *why = "";
	struct mload m;
	size_t bad = 0;
	int err, n = 0;

	if (skip_no_precopy(name))
		return;
	watchdog_arm(name, 240);
	err = mload_start(&m);
	if (!err) {
		struct uffdwp_region r = { m.arena, MLOAD_LEN };

		err = uffdwp_session_new(&ss, &r, 1, NULL);
	}
	if (!err) {
		n++;
		err = precopy(ss, fds[0], &st);
	}
	if (!err)
		err = load_chain(fds, 1, &dst, 1, NULL);
	if (!err)
		bad = mload_check(img, &why);
	if (!err && !bad) {
		n++;
		usleep(50000);
		err = uffdwp_session_snapshot(ss, fds[1], 0);
		if (!err)
			err = uffdwp_session_wait(ss, 120000);
		if (!err)
			err = load_chain(fds, 2, &dst, 1, NULL);
		if (!err)
			bad = mload_check(img, &why);
	}
	uffdwp_session_free(ss);	/* writers still running */
	mload_stop(&m);
	watchdog_disarm();
	tap_check(!err && !bad && n == 2, name,
		  "snapshot %d: error %d, inconsistent at byte %zu (%s)", n, err,
		  bad ? bad - 1 : 0, why);
	tap_diag("precopy madvise-load: %lu dontneed, %lu free+pageout, %lu pageout, %lu cold, %lu move_pages, %lu fork; %llu rounds",
		 m.ops[0], m.ops[1], m.ops[2], m.ops[3], m.ops[4], m.ops[5],
		 (unsigned long long)st.precopy_rounds);
	close(fds[0]);
	close(fds[1]);
	free(img);
}

int main(void)
{
	psz = page_size();
	watchdog(900);
	uffdwp_probe(&f);
	tap_plan(9);
	t_exact();
	t_writers("precopy-writers", false, 8UL << 20);
	t_writers("precopy-writers-thp", true, 8UL << 20);
	t_overflow();
	t_then_delta();
	t_discard();
	t_enospc();
	t_madvise_load();
	t_bad_input();
	return tap_done();
}
