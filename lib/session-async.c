// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * session-async.c: a session between snapshots in async mode, and the
 * write-log ring's harvests that pre-copy (precopy.c) shares.
 *
 * Where the session's userfaultfd has UFFDIO_SET_MODE and the ring
 * (snapshot.c's attach_ring()), the copier, once a snapshot's copy is
 * complete, switches the context to async mode: from then on the first
 * write to a protected page is resolved by the kernel and logged in the
 * ring, with no round trip through the handler.  The ring is the dirty
 * set between snapshots:
 *
 *  - The next instant, holding the handler, switches back to sync mode
 *    (when UFFDIO_SET_MODE returns, every async resolution is in the
 *    ring), then moves the ring's entries into the dirty bitmap, protecting
 *    their pages again in the same reset.  After an overflow the entries
 *    are dropped and every page that is not protected is taken as written
 *    (PAGEMAP_SCAN): those are exactly the pages unprotected since the
 *    last instant, by the kernel or, before the switch, by the handler.
 *  - uffdwp_session_dirty(), _dirty_ranges() and a change of regions first
 *    fold the ring into the bitmap the same way, without protecting
 *    anything (the entries are dropped; their pages stay writable).
 *    uffdwp_session_dirty() is async-signal-safe: when it cannot take the
 *    instant lock for a while (it may have interrupted its holder) it
 *    counts the ring's entries beside the bitmap without consuming them.
 *
 * Only for private anonymous regions with no PMD-mapped block at the
 * instant: an async write into a PMD-mapped huge page splits its mapping
 * (the kernel resolves 4 KiB at a time), where the handler unprotects the
 * whole block in one round trip and keeps it huge.  A session with huge
 * blocks, shmem or hugetlb, without /proc/self/pagemap (an overflow could
 * not be scanned), on a kernel without the ring or UFFDIO_SET_MODE, or
 * created with UFFDWP_SNAP_NO_UNPOPULATED stays in sync mode between
 * snapshots.  A region is added in sync mode (async mode would register
 * any file mapping); a harvest that fails makes the next snapshot a base.
 *
 * Discards (UFFD_EVENT_REMOVE) and replaced memory (UNMAP, REMAP) are read
 * by the handler in either mode and mark their pages dirty as before.  A
 * fault message queued in sync mode and read after the switch is stale:
 * enabling async mode woke its writer, whose retry the kernel resolved and
 * logged; the handler leaves it alone (snapshot-handler.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>

#include "snapshot.h"

#define SCAN_VEC	256

bool uw_session_sync_between;

/* PAGEMAP_SCAN's report callback: the pages into the map in ARG. */
struct scan_mark {
	struct uffdwp_snapshot *s;
	_Atomic uint64_t *map;
};

static void mark_scanned(void *arg, uintptr_t start, uintptr_t end)
{
	struct scan_mark *m = arg;

	uw_mark_pages(&m->s->rs, m->map, start, end - start);
}

int uw_set_async(struct uffdwp_snapshot *s, bool on)
{
	struct uffdio_set_mode m = { 0 };

	if (on)
		m.enable = UFFD_FEATURE_WP_ASYNC;
	else
		m.disable = UFFD_FEATURE_WP_ASYNC;
	return uw_snap_ioctl(s, UFFDIO_SET_MODE, &m);
}

int uw_ring_harvest(struct uffdwp_snapshot *s, _Atomic uint64_t *map,
		    enum uw_harvest how)
{
	const struct uffd_ring_header *h = s->ring;
	uint64_t prod = __atomic_load_n(&h->producer, __ATOMIC_ACQUIRE);
	/* The overflow count before the flag (the kernel publishes it
	 * after): the clear below then covers only the overflow seen here. */
	uint64_t overflows = __atomic_load_n(&h->overflows, __ATOMIC_ACQUIRE);
	bool overflow = (__atomic_load_n(&h->flags, __ATOMIC_ACQUIRE) &
			 UFFD_RING_OVERFLOW) ||
			prod - s->ring_consumer > h->entries;
	struct uffdio_ring_reset rr = { .consumer = prod,
					.overflows = overflows };
	struct page_region vec[SCAN_VEC];
	struct scan_mark m = { s, map };
	int err;

	/* Without pagemap an overflow cannot be scanned: keep its flag and
	 * the entries (the caller fails, the next snapshot is a base). */
	if (overflow && s->pagemap_fd < 0)
		return -EOPNOTSUPP;
	if (!overflow)
		uw_ring_mark(s->ring, s->ring_consumer, prod, &s->rs, map);
	/*
	 * Without an overflow a round's or an instant's reset protects the
	 * logged pages again, in one call with one TLB flush (the instant's
	 * own protect calls then find them protected and flush nothing); a
	 * fold only drops the entries.  After an overflow the scan below
	 * finds the pages, so the entries are only dropped.
	 */
	if (overflow)
		rr.flags = UFFDIO_RING_RESET_DISCARD |
			   UFFDIO_RING_RESET_CLEAR_OVERFLOW;
	else if (how == UW_HARVEST_FOLD)
		rr.flags = UFFDIO_RING_RESET_DISCARD;
	err = uw_snap_ioctl(s, UFFDIO_RING_RESET, &rr);
	/* -ESTALE: another overflow began after the look; the entries were
	 * dropped all the same and its flag stays set, so the next harvest
	 * scans again.  This one scans below. */
	if (err == -ESTALE)
		err = 0;
	if (err)
		return err;
	__atomic_store_n(&s->ring_consumer, prod, __ATOMIC_RELEASE);
	if (!overflow)
		return 0;
	/* Every page not protected was written: in a round, protect it as
	 * it is reported; otherwise only report it. */
	return uw_scan_regions(s->pagemap_fd, &s->rs,
			       how == UW_HARVEST_ROUND ?
			       PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC : 0,
			       PAGE_IS_WRITTEN, vec, SCAN_VEC, mark_scanned,
			       &m);
}

/* Set and read under the instant lock; read without it (atomically) by
 * the lock-free count. */
static void set_mode_flag(struct uffdwp_snapshot *s, bool on)
{
	__atomic_store_n(&s->async_mode, on, __ATOMIC_RELEASE);
}

/* The next snapshot a base: what the ring held could not be harvested. */
static void lost_track(struct uffdwp_snapshot *s)
{
	pthread_mutex_lock(&s->lock);
	s->need_base = true;
	pthread_mutex_unlock(&s->lock);
}

static int go_async_held(void *arg)
{
	struct uffdwp_snapshot *s = arg;

	uw_session_hold(s);
	if (!s->async_mode && !uw_set_async(s, true)) {
		set_mode_flag(s, true);
		/* What the ring logged in sync mode (zaps and the like, each
		 * also read as an event) joins the dirty set: harmless. */
		if (uw_session_fold(s) && !uw_set_async(s, false))
			set_mode_flag(s, false);
	}
	uw_session_release(s);
	return 0;
}

void uw_session_go_async(struct uffdwp_snapshot *s, bool aside)
{
	/* Without pagemap an overflow could not be harvested; shmem and
	 * hugetlb stay sync (a hugetlb entry may be larger than a block). */
	if (!s->session || !s->ring || s->nhuge || s->pagemap_fd < 0 ||
	    !s->anon_only || uw_session_sync_between)
		return;
	/* The caller's thread: aside, since until the switch a fault on its
	 * stack would wait for the handler, which waits for the lock. */
	if (aside)
		uw_run_aside(go_async_held, s);
	else
		go_async_held(s);
}

int uw_session_fold(struct uffdwp_snapshot *s)
{
	int err;

	if (!s->async_mode)
		return 0;
	err = uw_ring_harvest(s, s->dirty, UW_HARVEST_FOLD);
	if (err)
		lost_track(s);
	return err;
}

static int leave_async_held(void *arg)
{
	struct uffdwp_snapshot *s = arg;
	int err;

	uw_session_hold(s);
	err = uw_session_leave_async(s);
	uw_session_release(s);
	return err;
}

int uw_session_sync_now(struct uffdwp_snapshot *s)
{
	return __atomic_load_n(&s->async_mode, __ATOMIC_ACQUIRE) ?
	       uw_run_aside(leave_async_held, s) : 0;
}

int uw_session_fold_held(struct uffdwp_snapshot *s)
{
	int err;

	uw_session_hold(s);
	err = uw_session_fold(s);
	uw_session_release(s);
	return err;
}

/* The pages of the ring's unconsumed entries whose dirty bit is clear,
 * read without consuming anything (no lock, no allocation). */
static ssize_t ring_pending(struct uffdwp_snapshot *s)
{
	const struct uffd_ring_header *h = s->ring;
	const uint64_t *ent = (const uint64_t *)((const char *)s->ring +
						 h->entry_offset);
	uint64_t from = __atomic_load_n(&s->ring_consumer, __ATOMIC_ACQUIRE);
	uint64_t prod = __atomic_load_n(&h->producer, __ATOMIC_ACQUIRE);
	size_t psz = uw_page_size();
	ssize_t n = 0;

	for (uint64_t i = from; i < prod; i++) {
		uint64_t e = ent[i & (h->entries - 1)];
		uintptr_t a = (uintptr_t)(e & UFFD_RING_ENTRY_ADDR_MASK);
		size_t len = e & UFFD_RING_ENTRY_HUGE ? UW_HPAGE_SIZE : psz;

		for (uintptr_t p = a; p < a + len; p += psz) {
			long idx = uw_page_index(&s->rs, p);

			n += idx >= 0 && !uw_bit_test(s->dirty, (size_t)idx);
		}
	}
	return n;
}

struct scan_count {
	struct uffdwp_snapshot *s;
	ssize_t n;
};

static void count_scanned(void *arg, uintptr_t start, uintptr_t end)
{
	struct scan_count *c = arg;

	for (uintptr_t p = start; p < end; p += uw_page_size()) {
		long idx = uw_page_index(&c->s->rs, p);

		c->n += idx >= 0 && !uw_bit_test(c->s->dirty, (size_t)idx);
	}
}

/*
 * Without the lock, in async mode: the pages written since the instant
 * whose dirty bit is clear.  The ring's entries while it holds them all;
 * after an overflow every page not protected (PAGEMAP_SCAN, report only:
 * the pages the kernel resolved since the instant; the others the handler
 * unprotected are dirty already).
 */
static ssize_t pending_unlocked(struct uffdwp_snapshot *s)
{
	const struct uffd_ring_header *h = s->ring;
	struct page_region vec[SCAN_VEC / 4];
	struct scan_count c = { s, 0 };
	uint64_t prod = __atomic_load_n(&h->producer, __ATOMIC_ACQUIRE);
	bool overflow = (__atomic_load_n(&h->flags, __ATOMIC_ACQUIRE) &
			 UFFD_RING_OVERFLOW) ||
			prod - __atomic_load_n(&s->ring_consumer,
					       __ATOMIC_ACQUIRE) > h->entries;

	if (!overflow)
		return ring_pending(s);
	if (uw_scan_regions(s->pagemap_fd, &s->rs, 0, PAGE_IS_WRITTEN, vec,
			    SCAN_VEC / 4, count_scanned, &c))
		return 0;
	return c.n;
}

/* How long uffdwp_session_dirty() tries for the instant lock before it
 * counts without it (the lock may be held by the thread it interrupted). */
#define COUNT_TRIES	1000

ssize_t uw_session_count_dirty(struct uffdwp_snapshot *s)
{
	ssize_t n = 0, pending = 0;
	int tries = 0;
	bool held;

	while (!(held = !pthread_mutex_trylock(&s->instant_lock)) &&
	       ++tries < COUNT_TRIES)
		sched_yield();
	/* A failed fold consumed nothing (or the next snapshot is a base):
	 * count the ring aside as without the lock. */
	if ((!held || uw_session_fold(s)) &&
	    __atomic_load_n(&s->async_mode, __ATOMIC_ACQUIRE))
		pending = pending_unlocked(s);
	for (size_t w = 0; w < s->words; w++)
		n += __builtin_popcountll(atomic_load_explicit(
			&s->dirty[w], memory_order_relaxed));
	if (held)
		uw_session_release(s);
	return n + pending;
}

int uw_session_leave_async(struct uffdwp_snapshot *s)
{
	int err;

	if (!s->async_mode)
		return 0;
	err = uw_set_async(s, false);
	if (err)
		return err;
	set_mode_flag(s, false);
	err = uw_ring_harvest(s, s->dirty, UW_HARVEST_INSTANT);
	if (err)
		lost_track(s);
	return err;
}
