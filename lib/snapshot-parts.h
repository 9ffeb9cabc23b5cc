// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot-parts.h: what the parts of the snapshot engine share, beyond
 * snapshot.h: the engine's sizes and the page-set and file-layout helpers.
 * Internal to snapshot.c, snapshot-handler.c, snapshot-copier.c,
 * snapshot-spill.c and snapshot-huge.c (the consistency argument is at the
 * top of snapshot.c).
 */
#ifndef UFFDWP_SNAPSHOT_PARTS_H
#define UFFDWP_SNAPSHOT_PARTS_H

#include <stdatomic.h>
#include <sys/types.h>

#include "snapshot.h"

#define MSGS		32
#define SCAN_VEC	256
#define SAVE_RUN	512	/* pages read in one process_vm_readv(2) */

/* Sequentially consistent: with SAVING, it tells the copier when no save
 * can start any more (release_sink()). */
static inline bool cancelled(struct uffdwp_snapshot *s)
{
	return __atomic_load_n(&s->cancel, __ATOMIC_SEQ_CST);
}

static inline bool in_huge(struct uffdwp_snapshot *s, size_t idx)
{
	return s->huge && uw_bit_test(s->huge, idx);
}

/* Is page IDX in this snapshot? */
static inline bool in_set(struct uffdwp_snapshot *s, size_t idx)
{
	return !s->set || uw_bit_test(s->set, idx);
}

/* Where page IDX of the snapshot goes in a positional sink file: after
 * the prefix, at its rank among the stored pages. */
static inline off_t file_off(struct uffdwp_snapshot *s, size_t idx)
{
	size_t r = idx;

	if (s->set && !s->full_layout) {
		uint64_t below = (1ULL << (idx % 64)) - 1;

		r = s->rank[idx / 64] + (size_t)__builtin_popcountll(
			atomic_load_explicit(&s->set[idx / 64],
					     memory_order_relaxed) & below);
	}
	return s->spill_base + s->data_off + (off_t)(r * uw_page_size());
}

/* The position of page IDX among the file's stored pages. */
static inline size_t file_pos(struct uffdwp_snapshot *s, size_t idx)
{
	return (size_t)(file_off(s, idx) - s->spill_base - s->data_off) /
	       uw_page_size();
}

/* Where the handler spills page IDX: its place in a positional sink, else
 * its page index in the memfd. */
static inline off_t spill_off(struct uffdwp_snapshot *s, size_t idx)
{
	return s->sink_positional ? file_off(s, idx) :
	       (off_t)(idx * uw_page_size());
}

/* The handler (snapshot-handler.c) and the copier (snapshot-copier.c). */
void *uw_snap_handler_main(void *arg);
bool uw_snap_next_deferred(struct uffdwp_snapshot *s, struct uffd_msg *m);

#endif
