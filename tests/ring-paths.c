// SPDX-License-Identifier: GPL-2.0
/*
 * ring-paths: the write-log ring misses no change to a tracked page,
 * whichever kernel path makes it.
 *
 * Each case plays the consumer the ring is for: it keeps a shadow copy of
 * the tracked range, changes the range through one kernel path, harvests
 * the ring (copying every page an entry names into the shadow, or all of
 * the range when the overflow flag asks for a scan), resets it, and checks
 * that the shadow equals memory.  Then it writes a page and checks the same
 * again, so a page that lost its protection on the way is caught too.
 *
 *  - paths-thp-dontneed: MADV_DONTNEED of a PMD-mapped THP populated
 *    before it was protected (zap_huge_pmd);
 *  - paths-lazyfree: MADV_FREE then reclaim (MADV_PAGEOUT) discards clean
 *    protected small pages (try_to_unmap_one);
 *  - paths-lazyfree-thp: the same for a PMD-mapped THP (split on its way
 *    to reclaim in this tree, then discarded page by page);
 *  - paths-free-swapped: MADV_FREE of protected pages that are swapped out
 *    frees them at once (madvise_free_pte_range);
 *  - paths-mremap, paths-mremap-event-remap: mremap() of a tracked range,
 *    without and with UFFD_FEATURE_EVENT_REMAP, sets the overflow flag.
 *
 * KSM merging is covered by conformance-ksm (ksm-merge-ring-logs-write).
 * Without kernel/patches "mm: log every loss of a protected anonymous page
 * in the write-log ring" every case here fails.
 */
#define _GNU_SOURCE
#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static long psz;

/* The consumer's view of a tracked range. */
struct shadow {
	struct uring_view r;
	char *mem;
	char *copy;
	size_t len;
	bool overflowed;	/* some harvest fell back to a full copy */
};

/* Harvest every entry into the shadow, then reset: 0 or -errno. */
static int consume(struct shadow *s)
{
	uint64_t prod = ring_producer(&s->r);
	unsigned long lo = (unsigned long)s->mem, hi = lo + s->len;

	for (uint64_t i = s->r.consumer; i < prod; i++) {
		uint64_t e = ring_entry(&s->r, i);
		unsigned long a = e & ~(uint64_t)(psz - 1);
		unsigned long end = a + (e & UFFD_RING_ENTRY_HUGE ?
					 HPAGE_SIZE : (unsigned long)psz);

		/* The part of the entry's extent inside the range. */
		if (a < lo)
			a = lo;
		if (end > hi)
			end = hi;
		if (a < end)
			memcpy(s->copy + (a - lo), (char *)a, end - a);
	}
	if (ring_overflowed(&s->r)) {
		/* What a consumer does after an overflow: rescan it all. */
		s->overflowed = true;
		memcpy(s->copy, s->mem, s->len);
		return ring_reset(&s->r, prod, UFFDIO_RING_RESET_CLEAR_OVERFLOW,
				  NULL);
	}
	return ring_reset(&s->r, prod, 0, NULL);
}

/* Pages where the shadow differs from memory; the first goes to WHY. */
static int stale_pages(const struct shadow *s, char *why, size_t wlen)
{
	int n = 0;

	for (size_t off = 0; off < s->len; off += psz)
		if (memcmp(s->copy + off, s->mem + off, psz) && !n++)
			snprintf(why, wlen,
				 "page %zu changed but no entry covers it (memory byte 0 = %d, shadow %d)",
				 off / psz, s->mem[off], s->copy[off]);
	return n;
}

/*
 * Map LEN bytes (THP: one 2 MiB-aligned huge page, populated as such),
 * fill them, open a ring with EXTRA features, register, protect, and take
 * the shadow copy.  Returns 0, -errno, or 1 when THP was asked for and the
 * kernel gave none (WHY says so).
 */
static int shadow_open(struct shadow *s, size_t len, bool thp, uint64_t extra,
		       char *why, size_t wlen)
{
	int err;

	memset(s, 0, sizeof(*s));
	s->r.uffd = -1;
	s->len = len;
	s->mem = map_anon_aligned(len, thp ? HPAGE_SIZE : (size_t)psz);
	s->copy = malloc(len);
	if (!s->mem || !s->copy) {
		snprintf(why, wlen, "out of memory");
		return -ENOMEM;
	}
	madvise(s->mem, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	fill_pattern(s->mem, len, 7);
	if (thp && smaps_field_kb(s->mem, "AnonHugePages") < (long)(len >> 10)) {
		snprintf(why, wlen, "no THP for the area (AnonHugePages %ld kB)",
			 smaps_field_kb(s->mem, "AnonHugePages"));
		return 1;
	}
	err = ring_open(&s->r, 1024, extra);
	if (!err)
		err = uffd_register(s->r.uffd, s->mem, len,
				    UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(s->r.uffd, s->mem, len,
			      UFFDIO_WRITEPROTECT_MODE_WP);
	if (err) {
		snprintf(why, wlen, "ring/register/protect: %s", strerror(-err));
		return err;
	}
	memcpy(s->copy, s->mem, len);
	return 0;
}

static void shadow_close(struct shadow *s)
{
	if (s->r.uffd >= 0)
		ring_close(&s->r);
	if (s->mem)
		munmap(s->mem, s->len);
	free(s->copy);
}

/* Consume, compare; write page IDX; consume, compare. */
static bool shadow_follows(struct shadow *s, int idx, char *why, size_t wlen)
{
	int err = consume(s);

	if (err) {
		snprintf(why, wlen, "harvest/reset: %s", strerror(-err));
		return false;
	}
	if (stale_pages(s, why, wlen))
		return false;
	s->mem[idx * psz + 3] ^= 0x55;
	err = consume(s);
	if (err) {
		snprintf(why, wlen, "second harvest/reset: %s", strerror(-err));
		return false;
	}
	if (stale_pages(s, why, wlen)) {
		strncat(why, " (after a write that followed the reset)",
			wlen - strlen(why) - 1);
		return false;
	}
	return true;
}

static void case_thp_dontneed(void)
{
	const char *name = "paths-thp-dontneed";
	char why[256] = "";
	struct shadow s;
	int err = shadow_open(&s, HPAGE_SIZE, true, 0, why, sizeof(why));

	if (err == 1)
		tap_skip(name, "%s", why);
	else if (err)
		tap_fail(name, "%s", why);
	else if (madvise(s.mem, HPAGE_SIZE, MADV_DONTNEED))
		tap_fail(name, "MADV_DONTNEED: %s", strerror(errno));
	else
		tap_check(shadow_follows(&s, 100, why, sizeof(why)), name, "%s",
			  why);
	shadow_close(&s);
}

/* MADV_FREE then MADV_PAGEOUT until every page of [p, p + len) is gone
 * (neither present nor swapped: discarded), up to 20 rounds; a page can sit
 * in a CPU's LRU batch for a while.  True if they all went; the rounds it
 * took are reported when more than one. */
static bool discard(const char *name, char *p, size_t len)
{
	if (madvise(p, len, MADV_FREE))
		return false;
	for (int tries = 1; tries <= 20; tries++) {
		if (madvise(p, len, MADV_PAGEOUT))
			return false;
		if (pages_matching(p, len, 0, PM_PRESENT | PM_SWAP) ==
		    len / psz) {
			if (tries > 1)
				tap_diag("%s: reclaim discarded the pages after %d MADV_PAGEOUT rounds",
					 name, tries);
			return true;
		}
		usleep(10000);
	}
	return false;
}

static void case_lazyfree(const char *name, bool thp)
{
	size_t len = thp ? HPAGE_SIZE : 16 * (size_t)psz;
	char why[256] = "";
	struct shadow s;
	int err = shadow_open(&s, len, thp, 0, why, sizeof(why));

	if (err == 1) {
		tap_skip(name, "%s", why);
	} else if (err) {
		tap_fail(name, "%s", why);
	} else if (!discard(name, s.mem, len)) {
		/* Reclaim must drop clean lazyfree pages: if it does not, the
		 * path this case is about was never taken. */
		tap_fail(name, "reclaim did not discard the MADV_FREE pages: %zu of %zu still present or swapped",
			 len / psz - pages_matching(s.mem, len, 0,
						    PM_PRESENT | PM_SWAP),
			 len / psz);
	} else {
		tap_check(shadow_follows(&s, 5, why, sizeof(why)), name, "%s",
			  why);
	}
	shadow_close(&s);
}

static void case_free_swapped(void)
{
	const char *name = "paths-free-swapped";
	size_t len = 16 * (size_t)psz;
	char why[256] = "";
	struct shadow s;
	int err = shadow_open(&s, len, false, 0, why, sizeof(why));

	if (err) {
		tap_fail(name, "%s", why);
	} else if ((err = page_out(s.mem, len, PM_UFFD_WP))) {
		tap_fail(name, "MADV_PAGEOUT left %zu of %zu pages in swap with uffd-wp (%s)",
			 pages_swapped(s.mem, len, PM_UFFD_WP), len / psz,
			 strerror(-err));
	} else if (madvise(s.mem, len, MADV_FREE)) {
		tap_fail(name, "MADV_FREE: %s", strerror(errno));
	} else {
		tap_check(shadow_follows(&s, 7, why, sizeof(why)), name, "%s",
			  why);
	}
	shadow_close(&s);
}

struct remap_reader {
	pthread_t t;
	int uffd;
	volatile int events;
	volatile int stop;
};

/* With EVENT_REMAP, mremap() waits until the monitor has read the event. */
static void *read_events(void *arg)
{
	struct remap_reader *rr = arg;
	struct uffd_msg msg;

	while (!rr->stop)
		if (uffd_read_msg(rr->uffd, &msg, 100) == 1 &&
		    msg.event == UFFD_EVENT_REMAP)
			rr->events++;
	return NULL;
}

static void case_mremap(const char *name, bool event_remap)
{
	struct remap_reader rr = { 0 };
	size_t len = 8 * psz;
	char why[256] = "";
	struct shadow s;
	char *to;
	int err = shadow_open(&s, len, false,
			      event_remap ? UFFD_FEATURE_EVENT_REMAP : 0,
			      why, sizeof(why));

	if (err) {
		tap_fail(name, "%s", why);
		goto out;
	}
	s.mem[2 * psz] = 9;	/* an entry that will hold the old address */
	to = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (to == MAP_FAILED) {
		tap_fail(name, "mmap: %s", strerror(errno));
		goto out;
	}
	if (event_remap) {
		rr.uffd = s.r.uffd;
		pthread_create(&rr.t, NULL, read_events, &rr);
	}
	to = mremap(s.mem, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to);
	if (event_remap) {
		rr.stop = 1;
		pthread_join(rr.t, NULL);
	}
	if (to == MAP_FAILED) {
		tap_fail(name, "mremap: %s", strerror(errno));
		goto out;
	}
	s.mem = to;
	tap_check(ring_overflowed(&s.r) && (!event_remap || rr.events == 1),
		  name, "after mremap of the tracked range: overflow flag %s, %d remap events",
		  ring_overflowed(&s.r) ? "set" : "not set", rr.events);
out:
	shadow_close(&s);
}

int main(void)
{
	psz = page_size();
	watchdog(300);
	tap_plan(6);
	if (!ring_supported())
		tap_bail("UFFDIO_API does not offer UFFD_FEATURE_WP_RING");
	/* MADV_PAGEOUT sees every page once this CPU's LRU batch drains. */
	if (pin_to_cpu0())
		tap_diag("could not pin to CPU 0: reclaim may need retries");
	case_thp_dontneed();
	case_lazyfree("paths-lazyfree", false);
	case_lazyfree("paths-lazyfree-thp", true);
	case_free_swapped();
	case_mremap("paths-mremap", false);
	case_mremap("paths-mremap-event-remap", true);
	return tap_done();
}
