// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * session-dirty.c: a session's dirty set as ranges
 * (uffdwp_session_dirty_ranges()): the runs of the dirty bitmap, region by
 * region, handed to the caller a batch at a time without a fault.  A view:
 * nothing is consumed, and the handler may add pages meanwhile.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>

#include "snapshot.h"

#define BATCH	64

ssize_t uffdwp_session_dirty_ranges(struct uffdwp_session *ss,
				    struct uffdwp_region *ranges, size_t max)
{
	struct uffdwp_snapshot *s = uw_session_of(ss);
	struct uffdwp_region batch[BATCH];
	size_t psz = uw_page_size(), total = 0, held = 0;

	if (!s || (!ranges && max))
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	/* In async mode the pages written since are in the ring too (a
	 * failed fold makes the next snapshot a base: nothing to add). */
	uw_session_fold_held(s);
	for (size_t r = 0; r < s->rs.nr; r++) {
		size_t first = s->rs.first[r], end = first + s->rs.r[r].len / psz;
		size_t from = first, start;

		while (uw_bit_run(s->dirty, &from, end, &start)) {
			if (total < max) {
				batch[held].addr = (char *)s->rs.r[r].addr +
						   (start - first) * psz;
				batch[held].len = (from - start) * psz;
				held++;
			}
			total++;
			if (held == BATCH) {
				if (uw_copy_out(ranges + (total - held), batch,
						held * sizeof(*batch)))
					return -EINVAL;
				held = 0;
			}
		}
	}
	/* The last batch ends at min(MAX, TOTAL). */
	if (held && uw_copy_out(ranges + ((total < max ? total : max) - held),
				batch, held * sizeof(*batch)))
		return -EINVAL;
	return total > SSIZE_MAX ? SSIZE_MAX : (ssize_t)total;
}
