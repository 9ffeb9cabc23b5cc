// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * tracker_ring.c: the write-log ring backend (UFFD_FEATURE_WP_RING).  The
 * kernel appends the address of every page whose WP bit a write cleared to
 * a ring mapped read-only here; collect reads the new entries and one
 * UFFDIO_RING_RESET protects them all again.  On overflow a PAGEMAP_SCAN
 * over the regions finds every written page instead; the reset before it
 * then discards the entries (UFFDIO_RING_RESET_DISCARD) rather than
 * protecting pages the scan protects anyway, where the kernel allows.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/mman.h>

#include "internal.h"

#define RING_MIN	64
#define RING_MAX	(1u << 16)

bool uw_ring_no_discard;

int uw_ring_map(int uffd, uint64_t entries, void **ring, size_t *len)
{
	struct uffdio_ring_setup rs = { .entries = entries };
	void *p;
	int err;

	err = uw_ioctl(uffd, UFFDIO_RING_SETUP, &rs);
	if (err)
		return err;
	p = mmap(NULL, rs.mmap_size, PROT_READ, MAP_SHARED, uffd, 0);
	if (p == MAP_FAILED)
		return -errno;
	*ring = p;
	*len = rs.mmap_size;
	return 0;
}

static int ring_setup(struct uffdwp_tracker *t)
{
	uint64_t entries = RING_MIN;
	int err;

	while (entries < t->rs.pages && entries < RING_MAX)
		entries <<= 1;
	err = uw_ring_map(t->uffd, entries, &t->ring, &t->ring_len);
	if (err)
		return err;
	t->ring_no_discard = uw_ring_no_discard;
	t->ring_consumer = ((struct uffd_ring_header *)t->ring)->consumer;
	return 0;
}

static int ring_start(struct uffdwp_tracker *t)
{
	return uw_async_start(t, UFFD_FEATURE_WP_RING, ring_setup);
}

void uw_ring_mark(const void *ring, uint64_t from, uint64_t to,
		  const struct uw_regions *rs, _Atomic uint64_t *map)
{
	const struct uffd_ring_header *h = ring;
	const uint64_t *ent = (const uint64_t *)((const char *)ring +
						 h->entry_offset);

	for (uint64_t i = from; i < to; i++) {
		uint64_t e = ent[i & (h->entries - 1)];

		uw_mark_pages(rs, map, e & UFFD_RING_ENTRY_ADDR_MASK,
			      e & UFFD_RING_ENTRY_HUGE ? UW_HPAGE_SIZE :
			      uw_page_size());
	}
}

static int ring_gather(struct uffdwp_tracker *t)
{
	struct uffd_ring_header *h = t->ring;
	uint64_t prod = __atomic_load_n(&h->producer, __ATOMIC_ACQUIRE);
	/* The overflow count before the flag (the kernel publishes it
	 * after): a clear then covers only the overflow seen here. */
	uint64_t overflows = __atomic_load_n(&h->overflows, __ATOMIC_ACQUIRE);
	bool overflow = __atomic_load_n(&h->flags, __ATOMIC_ACQUIRE) &
			UFFD_RING_OVERFLOW;
	/* More than the ring holds: the entries are no help (the kernel's
	 * overflow flag prevents this; the library must not trust it). */
	bool lapped = prod - t->ring_consumer > h->entries;
	struct uffdio_ring_reset rr = { .consumer = prod,
					.overflows = overflows };
	bool discarded = false;
	int err;

	overflow |= lapped;
	if (overflow && !t->ring_no_discard) {
		/*
		 * The scan below finds the logged pages too, as they stay
		 * writable: drop their entries unread.  The reset has to come
		 * first, so that whatever is written from now on is either
		 * logged afresh or found by the scan.
		 */
		rr.flags = UFFDIO_RING_RESET_CLEAR_OVERFLOW |
			   UFFDIO_RING_RESET_DISCARD;
		err = uw_ioctl(t->uffd, UFFDIO_RING_RESET, &rr);
		/* -ESTALE: an overflow began after the look (the entries
		 * were dropped all the same); its flag stays set, so the
		 * next collect scans again.  This one scans below. */
		if (err == -ESTALE)
			err = 0;
		if (err && err != -EINVAL)
			return err;
		/* -EINVAL: a kernel without the flag; reset as below */
		t->ring_no_discard = err == -EINVAL;
		discarded = !err;
	}
	if (!discarded) {
		/* This reset protects the logged pages again, so the scan
		 * will not see them: take them from the entries first. */
		if (!lapped)
			uw_ring_mark(t->ring, t->ring_consumer, prod, &t->rs,
				     t->pending);
		rr.flags = overflow ? UFFDIO_RING_RESET_CLEAR_OVERFLOW : 0;
		/* Read the logged pages only after this.  -ESTALE as above:
		 * the entries were handled, the new overflow stays flagged. */
		err = uw_ioctl(t->uffd, UFFDIO_RING_RESET, &rr);
		if (err && err != -ESTALE)
			return err;
	}
	t->ring_consumer = prod;
	return overflow ? uw_scan_written(t) : 0;
}

static void ring_stop(struct uffdwp_tracker *t)
{
	if (t->ring)
		munmap(t->ring, t->ring_len);
	t->ring = NULL;
	uw_async_stop(t);
}

const struct uw_tracker_ops uw_ring_ops = {
	.start = ring_start,
	.gather = ring_gather,
	.stop = ring_stop,
};
