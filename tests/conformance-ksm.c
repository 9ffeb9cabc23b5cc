// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-ksm: write-protection survives KSM.
 *
 * The uffd-wp bit belongs to the mapping, not to the page behind it, so
 * ksmd replacing a protected page by the shared KSM page must leave it
 * protected (kernel/patches: "mm/ksm: keep the uffd-wp bit when merging a
 * page"; without it every page but the one that became the KSM page loses
 * the bit and its next write completes without a fault):
 *  - ksm-merge-keeps-wp-bit: after the merge every page still has PM_UFFD_WP;
 *  - ksm-merge-sync-write-faults: a write to each merged page faults, is held
 *    with the old content until the monitor resolves it, then lands;
 *  - ksm-merge-async-reports-write: in async mode a merged page reads as not
 *    written until it is written, then only it reads as written;
 *  - ksm-merge-ring-logs-write: the write-log ring has an entry for each
 *    merged page written after the merge;
 *  - ksm-protect-merged-pages: UFFDIO_WRITEPROTECT of pages that are already
 *    merged protects them;
 *  - ksm-unmerge-keeps-wp: MADV_UNMERGEABLE of protected merged pages gives
 *    each its own copy, still protected.
 *
 * ksmd is started here (/sys/kernel/mm/ksm/run) and stopped with every
 * merged page unmerged at the end.  Merging is confirmed by the pages'
 * frame numbers (pagemap, read as root): all NR_PAGES identical pages map
 * one frame.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#define NR_PAGES	8
#define FILL0		0x5a
#define MERGE_WAIT_MS	60000
#define MSG_WAIT_MS	3000
#define QUIET_MS	300
#define PFN_MASK	((1ULL << 55) - 1)

static long psz;
/* The content of the current case's pages: each case gets its own, so
 * that no stable-tree node of an earlier case's KSM page can match. */
static unsigned char fill = FILL0;
#define FILL		fill

static uint64_t pfn_of(const char *p)
{
	return pagemap_entry((void *)p) & PFN_MASK;
}

/* Pages of [p, p + NR_PAGES pages) that map the frame of page 0. */
static int pages_on_one_frame(const char *p)
{
	uint64_t pfn = pfn_of(p);
	int n = 0;

	if (!pfn)
		return 0;
	for (int i = 0; i < NR_PAGES; i++)
		n += pfn_of(p + i * psz) == pfn;
	return n;
}

/* Let ksmd merge [p, p + NR_PAGES pages): true once every page maps one
 * frame, false (WHY says how far it got) after MERGE_WAIT_MS. */
static bool ksm_merge(char *p, char *why, size_t wlen)
{
	long long start = now_ms(), end = start + MERGE_WAIT_MS;
	long scans0 = ksm_get("full_scans");
	int n = 0;

	if (madvise(p, NR_PAGES * psz, MADV_MERGEABLE)) {
		snprintf(why, wlen, "MADV_MERGEABLE: %s", strerror(errno));
		return false;
	}
	while (now_ms() < end) {
		n = pages_on_one_frame(p);
		if (n == NR_PAGES)
			return true;
		usleep(10000);
	}
	snprintf(why, wlen,
		 "ksmd merged %d of %d pages in %d ms (%ld full scans, pages_sharing %ld)",
		 n, NR_PAGES, MERGE_WAIT_MS, ksm_get("full_scans") - scans0,
		 ksm_get("pages_sharing"));
	return false;
}

/* NR_PAGES identical pages, THP off so ksmd sees small pages. */
static char *map_identical(void)
{
	char *p = mmap(NULL, NR_PAGES * psz, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	madvise(p, NR_PAGES * psz, MADV_NOHUGEPAGE);
	fill += 0x11;
	memset(p, FILL, NR_PAGES * psz);
	return p;
}

/* A uffd with FEATURES registered for WP over [p, p + NR_PAGES pages),
 * protected if PROTECT.  Returns the fd or -errno. */
static int arm(char *p, uint64_t features, bool protect)
{
	uint64_t got = 0;
	int uffd = uffd_open(features, &got), err;

	if (uffd < 0)
		return uffd;
	if ((got & features) != features) {
		close(uffd);
		return -EOPNOTSUPP;
	}
	err = uffd_register(uffd, p, NR_PAGES * psz, UFFDIO_REGISTER_MODE_WP,
			    NULL);
	if (!err && protect)
		err = uffd_wp(uffd, p, NR_PAGES * psz,
			      UFFDIO_WRITEPROTECT_MODE_WP);
	if (err) {
		close(uffd);
		return err;
	}
	return uffd;
}

/* Pages of the area without PM_UFFD_WP; the first is named in WHY. */
static int pages_without_wp(const char *p, char *why, size_t wlen)
{
	int n = 0;

	for (int i = 0; i < NR_PAGES; i++) {
		uint64_t e = pagemap_entry((void *)(p + i * psz));

		if (!(e & PM_UFFD_WP) && !n++)
			snprintf(why, wlen, "page %d lost uffd-wp: pagemap %#llx",
				 i, (unsigned long long)e);
	}
	return n;
}

/*
 * Store VAL at PAGE from a writer thread: one WP fault message at PAGE
 * arrives while the writer is held and PAGE still holds OLD; resolving it
 * lets the store land; no other message follows.  On failure WHY says
 * what went wrong and *STUCK tells whether the writer may still store.
 */
static bool write_held_until_resolved(int uffd, char *page, char old,
				      char val, bool *stuck, char *why,
				      size_t wlen)
{
	struct writer w = { 0 };
	struct uffd_msg msg;
	bool ok = false;
	int err;

	err = writer_start(&w, page, 1, val);
	if (err) {
		snprintf(why, wlen, "pthread_create: %s", strerror(-err));
		return false;
	}
	err = uffd_read_msg(uffd, &msg, MSG_WAIT_MS);
	if (err <= 0) {
		snprintf(why, wlen, "%s", err ? strerror(-err) :
			 (writer_wait(&w, 0) ?
			  "the write completed without a uffd-wp fault" :
			  "no fault message and the writer is blocked"));
		goto out;
	}
	if (msg.event != UFFD_EVENT_PAGEFAULT ||
	    !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) ||
	    (msg.arg.pagefault.address & ~(uint64_t)(psz - 1)) !=
	    (uint64_t)(unsigned long)page) {
		snprintf(why, wlen, "unexpected message: event %u flags %#llx at %#llx",
			 msg.event, (unsigned long long)msg.arg.pagefault.flags,
			 (unsigned long long)msg.arg.pagefault.address);
		goto out;
	}
	if (writer_wait(&w, 0) || *(volatile char *)page != old) {
		snprintf(why, wlen, "the write landed before the fault was resolved");
		goto out;
	}
	err = uffd_wp(uffd, page, psz, 0);
	if (err) {
		snprintf(why, wlen, "UFFDIO_WRITEPROTECT(0): %s", strerror(-err));
		goto out;
	}
	if (!writer_wait(&w, MSG_WAIT_MS)) {
		snprintf(why, wlen, "the writer stayed blocked after the resolution");
		goto out;
	}
	if (*(volatile char *)page != val) {
		snprintf(why, wlen, "the write did not land");
		goto out;
	}
	err = uffd_read_msg(uffd, &msg, QUIET_MS);
	if (err) {
		snprintf(why, wlen, "a second message (or error %d) followed", err);
		goto out;
	}
	ok = true;
out:
	if (!writer_joined(&w, MSG_WAIT_MS)) {
		uffd_unregister(uffd, page, psz);
		uffd_wake(uffd, page, psz);
		if (!writer_joined(&w, MSG_WAIT_MS))
			*stuck = true;
	}
	return ok;
}

/* Every byte of the area is FILL except byte 0 of the pages in WRITTEN
 * (a bit per page), which holds 'a' + page index. */
static bool contents_ok(const char *p, unsigned int written, char *why,
			size_t wlen)
{
	for (int i = 0; i < NR_PAGES; i++)
		for (long b = 0; b < psz; b++) {
			char want = (!b && (written >> i & 1)) ? 'a' + i : FILL;

			if (p[i * psz + b] != want) {
				snprintf(why, wlen, "page %d byte %ld is %#x, want %#x",
					 i, b, p[i * psz + b] & 0xff, want & 0xff);
				return false;
			}
		}
	return true;
}

/*
 * Write page FIRST and every STEP-th page after it through
 * write_held_until_resolved(), then check that the area holds exactly
 * those writes.  False with WHY (naming the page) on the first problem.
 */
static bool writes_held(int uffd, char *p, int first, int step, bool *stuck,
			char *why, size_t wlen)
{
	char what[200];
	unsigned int written = 0;

	for (int i = first; i < NR_PAGES; i += step) {
		if (!write_held_until_resolved(uffd, p + i * psz, FILL, 'a' + i,
					       stuck, what, sizeof(what))) {
			snprintf(why, wlen, "page %d: %s", i, what);
			return false;
		}
		written |= 1u << i;
	}
	return contents_ok(p, written, why, wlen);
}

static void release(char *p, int uffd, bool stuck)
{
	if (uffd >= 0)
		close(uffd);
	if (p && !stuck)
		munmap(p, NR_PAGES * psz);
}

static void case_merge_sync(void)
{
	char why[256] = "", why2[256] = "";
	bool stuck = false, ok;
	char *p = map_identical();
	int uffd = -1;

	if (!p)
		FAIL("mmap: %s", strerror(errno));
	uffd = arm(p, UFFD_FEATURE_PAGEFAULT_FLAG_WP, true);
	if (uffd < 0)
		FAIL("uffd register/protect: %s", strerror(-uffd));
	if (!ksm_merge(p, why, sizeof(why)))
		goto out;
	ok = !pages_without_wp(p, why2, sizeof(why2));
	tap_check(ok, "ksm-merge-keeps-wp-bit", "%s", why2);
	tap_check(writes_held(uffd, p, 0, 1, &stuck, why2, sizeof(why2)),
		  "ksm-merge-sync-write-faults", "%s", why2);
	goto done;
out:
	tap_fail("ksm-merge-keeps-wp-bit", "%s", why);
	tap_fail("ksm-merge-sync-write-faults", "no merged protected area: %s", why);
done:
	release(p, uffd, stuck);
}

static void case_merge_async(void)
{
	const char *name = "ksm-merge-async-reports-write";
	char why[256] = "", first[128] = "";
	char *p = map_identical();
	int uffd = -1, lost;

	if (!p)
		FAIL("mmap: %s", strerror(errno));
	uffd = arm(p, UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_ASYNC,
		   true);
	if (uffd == -EOPNOTSUPP) {
		tap_skip(name, "UFFD_FEATURE_WP_ASYNC not offered by this kernel");
		goto done;
	}
	if (uffd < 0)
		FAIL("uffd register/protect: %s", strerror(-uffd));
	if (!ksm_merge(p, why, sizeof(why)))
		goto out;
	lost = pages_without_wp(p, first, sizeof(first));
	if (lost)
		FAIL("before any write, %d of %d merged pages read as written (%s)",
		     lost, NR_PAGES, first);
	p[3 * psz] = 'a' + 3;
	for (int i = 0; i < NR_PAGES; i++)
		if (!!page_wp(p + i * psz) != (i != 3))
			FAIL("after writing page 3, page %d reads as %s", i,
			     page_wp(p + i * psz) ? "not written" : "written");
	if (!contents_ok(p, 1 << 3, why, sizeof(why)))
		goto out;
	tap_pass(name);
	goto done;
out:
	tap_fail(name, "%s", why);
done:
	release(p, uffd, false);
}

static void case_merge_ring(void)
{
	const char *name = "ksm-merge-ring-logs-write";
	struct uring_view r = { .uffd = -1 };
	char why[256] = "";
	char *p = NULL;
	uint64_t prod;
	unsigned int seen = 0;
	int err;

	if (!ring_supported()) {
		tap_skip(name, "this kernel has no write-log ring (UFFD_FEATURE_WP_RING)");
		return;
	}
	err = ring_open(&r, 64, 0);
	if (err) {
		snprintf(why, sizeof(why), "ring_open: %s", strerror(-err));
		goto out;
	}
	p = map_identical();
	if (!p)
		FAIL("mmap: %s", strerror(errno));
	err = uffd_register(r.uffd, p, NR_PAGES * psz, UFFDIO_REGISTER_MODE_WP,
			    NULL);
	if (!err)
		err = uffd_wp(r.uffd, p, NR_PAGES * psz,
			      UFFDIO_WRITEPROTECT_MODE_WP);
	if (err)
		FAIL("register/protect: %s", strerror(-err));
	if (!ksm_merge(p, why, sizeof(why)))
		goto out;
	prod = ring_producer(&r);
	if (prod)
		FAIL("%llu entries logged by the merge alone",
		     (unsigned long long)prod);
	p[2 * psz] = 'a' + 2;
	p[5 * psz] = 'a' + 5;
	prod = ring_producer(&r);
	for (uint64_t i = 0; i < prod && i < 64; i++) {
		uint64_t a = ring_entry(&r, i) & ~(uint64_t)(psz - 1);
		long idx = ((long)a - (long)(unsigned long)p) / psz;

		if (idx >= 0 && idx < NR_PAGES)
			seen |= 1u << idx;
	}
	if (prod != 2 || seen != ((1u << 2) | (1u << 5)))
		FAIL("writes to merged pages 2 and 5 logged %llu entries covering pages %#x (want 2 entries, pages 0x24)",
		     (unsigned long long)prod, seen);
	if (!contents_ok(p, (1 << 2) | (1 << 5), why, sizeof(why)))
		goto out;
	tap_pass(name);
	goto done;
out:
	tap_fail(name, "%s", why);
done:
	if (p)
		munmap(p, NR_PAGES * psz);
	if (r.uffd >= 0)
		ring_close(&r);
}

static void case_protect_merged(void)
{
	const char *name = "ksm-protect-merged-pages";
	char why[256] = "";
	bool stuck = false;
	char *p = map_identical();
	int uffd = -1, err;

	if (!p)
		FAIL("mmap: %s", strerror(errno));
	uffd = arm(p, UFFD_FEATURE_PAGEFAULT_FLAG_WP, false);
	if (uffd < 0)
		FAIL("uffd register: %s", strerror(-uffd));
	if (!ksm_merge(p, why, sizeof(why)))
		goto out;
	err = uffd_wp(uffd, p, NR_PAGES * psz, UFFDIO_WRITEPROTECT_MODE_WP);
	if (err)
		FAIL("UFFDIO_WRITEPROTECT of merged pages: %s", strerror(-err));
	if (pages_without_wp(p, why, sizeof(why)))
		goto out;
	if (pages_on_one_frame(p) != NR_PAGES)
		FAIL("protecting unmerged the pages (%d of %d share a frame)",
		     pages_on_one_frame(p), NR_PAGES);
	if (!writes_held(uffd, p, 0, 3, &stuck, why, sizeof(why)))
		goto out;
	tap_pass(name);
	goto done;
out:
	tap_fail(name, "%s", why);
done:
	release(p, uffd, stuck);
}

static void case_unmerge(void)
{
	const char *name = "ksm-unmerge-keeps-wp";
	char why[256] = "";
	bool stuck = false;
	char *p = map_identical();
	int uffd = -1, shared;

	if (!p)
		FAIL("mmap: %s", strerror(errno));
	uffd = arm(p, UFFD_FEATURE_PAGEFAULT_FLAG_WP, true);
	if (uffd < 0)
		FAIL("uffd register/protect: %s", strerror(-uffd));
	if (!ksm_merge(p, why, sizeof(why)))
		goto out;
	if (madvise(p, NR_PAGES * psz, MADV_UNMERGEABLE))
		FAIL("MADV_UNMERGEABLE: %s", strerror(errno));
	shared = pages_on_one_frame(p);
	if (shared != 1)
		FAIL("after MADV_UNMERGEABLE %d pages still share a frame",
		     shared);
	if (pages_without_wp(p, why, sizeof(why)))
		goto out;
	if (!writes_held(uffd, p, 1, 3, &stuck, why, sizeof(why)))
		goto out;
	tap_pass(name);
	goto done;
out:
	tap_fail(name, "%s", why);
done:
	release(p, uffd, stuck);
}

int main(void)
{
	long smart_scan;
	int err;

	psz = page_size();
	watchdog(400);
	tap_plan(6);
	if (access("/sys/kernel/mm/ksm/run", W_OK))
		tap_bail("/sys/kernel/mm/ksm/run: %s (the lanes build with CONFIG_KSM=y)",
			 strerror(errno));
	/*
	 * No smart scan: it skips a page that did not merge for up to 8 full
	 * scans, by an age kept in its rmap_item, and an rmap_item outlives
	 * the unmapping of its address until ksmd passes there.  A case's
	 * area mapped where the previous case's was takes over rmap_items
	 * whose ages the previous case's writes left different, page by
	 * page; with every page on a skip cycle of its own no two were ever
	 * scanned in the same round, and ksmd merged nothing for 3746 full
	 * scans (twice, in ksm-merge-async-reports-write, which follows the
	 * case that writes each merged page in turn).  Without skipping,
	 * identical pages merge in their second scan.
	 */
	smart_scan = ksm_get("smart_scan");
	if (smart_scan > 0 && (err = ksm_set("smart_scan", "0")))
		tap_bail("ksm smart_scan=0: %s", strerror(-err));
	/* Small areas: scan everything every round, rounds close together. */
	err = ksm_set("pages_to_scan", "1000");
	if (!err)
		err = ksm_set("sleep_millisecs", "10");
	if (!err)
		err = ksm_set("run", "1");
	if (err)
		tap_bail("starting ksmd: %s", strerror(-err));

	case_merge_sync();
	case_merge_async();
	case_merge_ring();
	case_protect_merged();
	case_unmerge();

	/* Unmerge whatever is left and stop ksmd. */
	err = ksm_set("run", "2");
	if (err)
		tap_diag("stopping ksmd (run=2): %s", strerror(-err));
	if (smart_scan > 0 && (err = ksm_set("smart_scan", "1")))
		tap_diag("restoring ksm smart_scan=1: %s", strerror(-err));
	return tap_done();
}
