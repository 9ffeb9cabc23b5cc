// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot-huge.c: the map of huge blocks.  Before the snapshot instant
 * PAGEMAP_SCAN finds the PMD-mapped 2 MiB blocks of the regions; a fault in
 * one saves all of the block's pages and unprotects the block as one
 * (snapshot-handler.c), so the kernel keeps the PMD mapping.
 */
#define _GNU_SOURCE
#include <stdatomic.h>

#include "snapshot-parts.h"

/* Mark the pages of the 2 MiB blocks inside [START, END). */
static void mark_huge(void *arg, uintptr_t start, uintptr_t end)
{
	struct uffdwp_snapshot *s = arg;
	size_t psz = uw_page_size();
	uintptr_t b = (start + UW_HPAGE_SIZE - 1) & ~(uintptr_t)(UW_HPAGE_SIZE - 1);

	for (; b + UW_HPAGE_SIZE <= end; b += UW_HPAGE_SIZE) {
		size_t i = (size_t)uw_page_index(&s->rs, b);

		for (size_t p = 0; p < UW_HPAGE_SIZE / psz; p++)
			uw_bit_set(s->huge, i + p);
		s->nhuge++;
	}
}

/* Mark the pages of every 2 MiB block that is PMD-mapped now (forgetting
 * earlier marks).  Best effort: without PAGEMAP_SCAN every fault saves a
 * single page. */
void uw_snap_find_huge(struct uffdwp_snapshot *s)
{
	struct page_region vec[SCAN_VEC];

	for (size_t w = 0; w < s->huge_len / 8; w++)
		atomic_store_explicit(&s->huge[w], 0, memory_order_relaxed);
	s->nhuge = 0;
	if (s->pagemap_fd >= 0)
		uw_scan_regions(s->pagemap_fd, &s->rs, 0, PAGE_IS_HUGE, vec,
				SCAN_VEC, mark_huge, s);
}
