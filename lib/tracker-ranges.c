// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * tracker-ranges.c: uffdwp_tracker_collect_ranges(), the pending pages of
 * a tracker as runs of adjacent pages.  The rounds are collect()'s
 * (uw_tracker_round_start/end, tracker.c): gather only once the last
 * gather's pages are all handed out; a round whose last call filled MAX
 * ends with a call returning 0.
 *
 * Only the collecting thread changes the pending bitmap (the backends'
 * gather runs in it), so the ranges are first written to the caller's
 * array, batch by batch without a fault, and their bits cleared only
 * once every batch arrived: an array that is not writable is -EINVAL
 * with nothing taken.
 */
#define _GNU_SOURCE
#include <errno.h>

#include "internal.h"

#define BATCH	64

/* Clear the bits [START, END) of MAP. */
static void clear_run(_Atomic uint64_t *map, size_t start, size_t end)
{
	while (start < end) {
		size_t n = 64 - start % 64;
		uint64_t mask;

		if (n > end - start)
			n = end - start;
		mask = (n == 64 ? ~0ULL : ((1ULL << n) - 1)) << (start % 64);
		atomic_fetch_and_explicit(&map[start / 64], ~mask,
					  memory_order_relaxed);
		start += n;
	}
}

/* Each region's runs of pending pages, up to MAX of them: written to
 * RANGES (CLEAR false), or their bits cleared (CLEAR true).  Returns the
 * number of runs, or -EINVAL when RANGES is not writable. */
static ssize_t runs(struct uffdwp_tracker *t, struct uffdwp_region *ranges,
		    size_t max, bool clear)
{
	struct uffdwp_region batch[BATCH];
	size_t psz = uw_page_size(), n = 0, held = 0;

	for (size_t r = 0; r < t->rs.nr && n < max; r++) {
		size_t first = t->rs.first[r], end = first + t->rs.r[r].len / psz;
		size_t from = first, start;

		while (n < max && uw_bit_run(t->pending, &from, end, &start)) {
			n++;
			if (clear) {
				clear_run(t->pending, start, from);
				continue;
			}
			batch[held].addr = (char *)t->rs.r[r].addr +
					   (start - first) * psz;
			batch[held].len = (from - start) * psz;
			if (++held == BATCH) {
				if (uw_copy_out(ranges + n - held, batch,
						held * sizeof(*batch)))
					return -EINVAL;
				held = 0;
			}
		}
	}
	if (held && uw_copy_out(ranges + n - held, batch, held * sizeof(*batch)))
		return -EINVAL;
	return (ssize_t)n;
}

ssize_t uffdwp_tracker_collect_ranges(struct uffdwp_tracker *t,
				      struct uffdwp_region *ranges, size_t max)
{
	ssize_t n;
	int err;

	if (!uw_handle_live(t, UW_TRACKER_MAGIC) || (!ranges && max))
		return -EINVAL;
	if (uw_tracker_foreign(t))
		return -ECHILD;
	err = uw_tracker_round_start(t);
	if (err <= 0)
		return err;
	n = runs(t, ranges, max, false);
	if (n < 0)
		return n;
	runs(t, NULL, (size_t)n, true);
	uw_tracker_round_end(t, (size_t)n, max);
	return n;
}
