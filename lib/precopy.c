// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * precopy.c: a session's base snapshot taken with pre-copy, so that the
 * pause follows what is written while it is taken, not the regions' size.
 *
 * The session's userfaultfd has the write-log ring and can switch between
 * sync and async write protection (UFFDIO_SET_MODE, kernel/patches).
 *
 *  1. Holding the handler: switch to async mode (a fault message still
 *     queued from sync mode is now stale: the handler skips faults while
 *     ASYNC_MODE is set), drop the ring's old entries, protect every page
 *     (empty ones get markers) and forget the dirty bitmap.
 *  2. Round 0 writes every page to the file at its index, from live
 *     memory.  A page written after step 1 is logged in the ring before
 *     the write lands, so a torn copy is always copied again.
 *  3. Each later round reads the ring's new entries, protects their pages
 *     again with UFFDIO_RING_RESET, and only then writes those pages.  On
 *     overflow the entries are discarded and a PAGEMAP_SCAN that protects
 *     as it reports (PM_SCAN_WP_MATCHING) finds the written pages instead.
 *     Rounds end when one finds at most TARGET_PAGES pages, stops
 *     shrinking, or MAX_ROUNDS were done.
 *  4. The instant (session.c) with the handler held: switch to sync mode;
 *     when that returns every async resolution is in the ring.  The
 *     ring's entries since the last round (or, after an overflow, every
 *     page that is not protected) go into the dirty bitmap, the session
 *     makes them the snapshot's set and protects them again.  When the
 *     handler is let go, the copier writes the set's pages at their
 *     indexes, saving each before its first write as any snapshot does.
 *
 * Every other page was written by a round after its last protection and
 * has stayed protected and unwritten since, so the file holds every page
 * as it was at the instant.  The session then goes on in sync mode.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snapshot.h"

#define DEFAULT_TARGET	1024
#define DEFAULT_ROUNDS	8

/* Write the pages set in MAP to the file, each at its index, and clear
 * MAP.  Returns the number of pages or -errno. */
static int64_t write_marked(struct uffdwp_snapshot *s, _Atomic uint64_t *map)
{
	size_t psz = uw_page_size();
	off_t base = s->spill_base + s->data_off;
	int64_t n = 0;

	for (size_t i = 0; i < s->rs.pages;) {
		size_t j = i;

		if (!(i % 64) && !atomic_load_explicit(&map[i / 64],
						       memory_order_relaxed)) {
			i += 64;
			continue;
		}
		while (j < s->rs.pages && uw_bit_test(map, j))
			j++;
		if (j == i) {
			i++;
			continue;
		}
		/* indexes run on across regions: split at address gaps */
		for (size_t k = i; k < j;) {
			uintptr_t a = uw_page_addr(&s->rs, k);
			size_t m = 1;
			int err;

			while (k + m < j && uw_page_addr(&s->rs, k + m) ==
					    a + m * psz)
				m++;
			err = uw_io_all(s->opts.sink_fd, (char *)a, m * psz,
					base + (off_t)(k * psz), IO_PWRITE);
			if (err)
				return err;
			k += m;
		}
		n += (int64_t)(j - i);
		i = j;
	}
	for (size_t w = 0; w < s->words; w++)
		atomic_store_explicit(&map[w], 0, memory_order_relaxed);
	return n;
}

/* Step 1: async mode, old entries dropped, every page protected. */
static int start_tracking(struct uffdwp_snapshot *s)
{
	const struct uffd_ring_header *h = s->ring;
	struct uffdio_ring_reset rr;
	int err;

	uw_session_hold(s);
	err = uw_set_async(s, true);
	if (!err) {
		__atomic_store_n(&s->async_mode, true, __ATOMIC_RELEASE);
		/* Whatever overflow is flagged: every page is protected
		 * below.  One that begins after this look keeps its flag
		 * (-ESTALE), and the first harvest scans for it. */
		rr = (struct uffdio_ring_reset){
			.overflows = __atomic_load_n(&h->overflows,
						     __ATOMIC_ACQUIRE),
			.consumer = __atomic_load_n(&h->producer,
						    __ATOMIC_ACQUIRE),
			.flags = UFFDIO_RING_RESET_DISCARD |
				 UFFDIO_RING_RESET_CLEAR_OVERFLOW,
		};
		err = uw_snap_ioctl(s, UFFDIO_RING_RESET, &rr);
		if (err == -ESTALE)
			err = 0;
		if (!err)
			s->ring_consumer = rr.consumer;
	}
	for (size_t i = 0; !err && i < s->rs.nr; i++)
		err = uw_snap_wp(s, (uintptr_t)s->rs.r[i].addr,
				 s->rs.r[i].len, true, false);
	/* No snapshot runs: every page settled, none in a set yet. */
	for (size_t i = 0; !err && i < s->rs.pages; i++)
		atomic_store_explicit(&s->state[i], ST_DONE,
				      memory_order_relaxed);
	for (size_t w = 0; !err && w < s->words; w++) {
		atomic_store_explicit(&s->set[w], 0, memory_order_relaxed);
		atomic_store_explicit(&s->dirty[w], 0, memory_order_relaxed);
	}
	uw_session_release(s);
	return err;
}

/* A failed pre-copy: back to sync mode, the next snapshot a base.  The
 * pages stay protected; the handler notes and releases their writes. */
static int stop_tracking(struct uffdwp_snapshot *s, int err)
{
	uw_session_hold(s);
	if (s->async_mode && !uw_set_async(s, false))
		__atomic_store_n(&s->async_mode, false, __ATOMIC_RELEASE);
	s->need_base = true;
	uw_session_release(s);
	return err;
}

/* Test seam: called after each round's writes with the round's number
 * (tests/lib-precopy.c discards pages there). */
void (*uw_precopy_after_round)(uint64_t round);

/* What the last instant's switch to sync mode and its harvest took, in
 * ns: a measurement seam for the benchmark (not exported). */
uint64_t uw_precopy_switch_ns, uw_precopy_harvest_ns;

/* Step 4's part under the instant lock. */
static int final_harvest(struct uffdwp_snapshot *s, void *arg)
{
	uint64_t t0 = uw_now_ns(), t1;
	int err;

	(void)arg;
	err = uw_set_async(s, false);
	t1 = uw_now_ns();
	uw_precopy_switch_ns = t1 - t0;
	if (err)
		return err;
	__atomic_store_n(&s->async_mode, false, __ATOMIC_RELEASE);
	s->full_layout = true;
	err = uw_ring_harvest(s, s->dirty, UW_HARVEST_INSTANT);
	uw_precopy_harvest_ns = uw_now_ns() - t1;
	return err;
}

int uffdwp_session_precopy(struct uffdwp_session *ss, int fd,
			   const struct uffdwp_precopy_opts *opts)
{
	struct uffdwp_snapshot *s = (struct uffdwp_snapshot *)ss;
	struct uffdwp_precopy_opts o = { 0 };
	uint64_t t_start = uw_now_ns(), rounds = 0, copied = 0;
	_Atomic uint64_t *map = NULL;
	int64_t n, prev = 0;
	int err;

	if (!ss || fd < 0)
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	if (opts) {
		if (uw_copy_in(&o, opts, sizeof(o)))
			return -EINVAL;
		for (size_t i = 0; i < sizeof(o.__reserved) / 8; i++)
			if (o.__reserved[i])
				return -EINVAL;
		if (o.flags)
			return -EINVAL;
	}
	if (!o.target_pages)
		o.target_pages = DEFAULT_TARGET;
	if (!o.max_rounds)
		o.max_rounds = DEFAULT_ROUNDS;
	if (!s->ring)
		return -EOPNOTSUPP;
	err = uw_session_prepare(s, fd);
	if (err)
		return err;
	/* Rounds write pages where they end up: a file at known offsets. */
	if (!s->sink_positional)
		return -EINVAL;
	map = uw_alloc(s->bitmap_len);
	if (!map)
		return -ENOMEM;
	err = start_tracking(s);
	for (size_t i = 0; !err && i < s->rs.pages; i++)
		uw_bit_set(map, i);
	/* Round 0 writes every page; each later one what was written since
	 * the round before, until one is small or no smaller than that. */
	while (!err) {
		n = write_marked(s, map);
		if (n < 0) {
			err = (int)n;
			break;
		}
		copied += (uint64_t)n;
		if (uw_precopy_after_round)
			uw_precopy_after_round(rounds);
		if (++rounds >= o.max_rounds ||
		    (rounds > 1 && ((uint64_t)n <= o.target_pages ||
				    (rounds > 2 && n >= prev))))
			break;
		prev = n;
		/* Under the lock: uffdwp_session_dirty() may fold the ring
		 * meanwhile (its pages then reach the instant's set through
		 * the dirty bitmap). */
		uw_session_hold(s);
		err = uw_ring_harvest(s, map, UW_HARVEST_ROUND);
		uw_session_release(s);
	}
	uw_free(map, s->bitmap_len);
	if (err)
		return stop_tracking(s, err);
	err = uw_session_instant(s, false, t_start, final_harvest, NULL);
	/* the instant failed: nothing tracks any more (fail_instant) */
	if (err) {
		stop_tracking(s, err);
		s->full_layout = false;
		return err;
	}
	pthread_mutex_lock(&s->lock);
	s->st.precopy_rounds = rounds;
	s->st.precopy_pages = copied;
	pthread_mutex_unlock(&s->lock);
	return 0;
}
