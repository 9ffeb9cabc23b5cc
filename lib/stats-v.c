// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * stats-v.c: struct uffdwp_stats_v, the counters that grow without new
 * symbols.  The caller's SIZE says how much of the struct it knows; the
 * library fills what both know, zeroes the rest of the caller's struct
 * and says in SIZE how much it filled.  Everything reaches the caller's
 * struct without a fault.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "snapshot.h"

#define MAX_SIZE	4096

/* Whether a session runs in async mode between snapshots now. */
static bool async_between(struct uffdwp_snapshot *s)
{
	bool on;

	if (!s->session)
		return false;
	uw_session_hold(s);
	on = s->async_mode;
	uw_session_release(s);
	return on;
}

static int fill(struct uffdwp_snapshot *s, struct uffdwp_stats_v *out)
{
	struct uffdwp_snapshot_stats st;
	struct uffdwp_stats_v v;
	char zero[256] = { 0 };
	uint32_t size;
	ssize_t dirty = 0;
	size_t mine;
	int err;

	if (!out || uw_copy_in(&size, &out->size, sizeof(size)) ||
	    size < 8 || size > MAX_SIZE || size % 8)
		return -EINVAL;
	if (uw_snap_foreign(s))
		return -ECHILD;
	if (s->session && !s->taken)
		return -ENOENT;
	err = uffdwp_snapshot_stats(s, &st);
	if (err)
		return err;
	if (s->session)
		dirty = uffdwp_session_dirty((struct uffdwp_session *)s);
	memset(&v, 0, sizeof(v));
	mine = size < sizeof(v) ? size : sizeof(v);
	v.size = (uint32_t)mine;
	v.flags = (st.done ? UFFDWP_STATS_DONE : 0) |
		  (st.used_unpopulated ? UFFDWP_STATS_USED_UNPOPULATED : 0) |
		  (st.user_mode_only ? UFFDWP_STATS_USER_MODE_ONLY : 0) |
		  (async_between(s) ? UFFDWP_STATS_ASYNC_BETWEEN : 0);
	v.error = st.error;
	v.pause_ns = st.pause_ns;
	v.start_ns = st.start_ns;
	v.total_ns = st.total_ns;
	v.pages = st.pages;
	v.pages_copied = st.pages_copied;
	v.faults = st.faults;
	v.saved = st.saved;
	v.side_peak = st.side_peak;
	v.side_cap = st.side_cap;
	v.fixed_bytes = st.fixed_bytes;
	v.spilled = st.spilled;
	v.spill_peak = st.spill_peak;
	v.huge_blocks = st.huge_blocks;
	v.huge_saves = st.huge_saves;
	v.fault_max_ns = st.fault_max_ns;
	v.epoch = st.epoch;
	v.precopy_rounds = st.precopy_rounds;
	v.precopy_pages = st.precopy_pages;
	v.nregions = s->rs.nr;
	v.region_pages = s->rs.pages;
	v.dirty_pages = dirty > 0 ? (uint64_t)dirty : 0;
	/* The caller's bytes past ours: zero (a newer caller's fields). */
	for (size_t off = mine; off < size; off += sizeof(zero)) {
		size_t n = size - off < sizeof(zero) ? size - off : sizeof(zero);

		if (uw_copy_out((char *)out + off, zero, n))
			return -EINVAL;
	}
	return uw_copy_out(out, &v, mine);
}

int uffdwp_snapshot_stats_v(struct uffdwp_snapshot *s,
			    struct uffdwp_stats_v *st)
{
	s = uw_snapshot_of(s);
	return s ? fill(s, st) : -EINVAL;
}

int uffdwp_session_stats_v(struct uffdwp_session *ss,
			   struct uffdwp_stats_v *st)
{
	struct uffdwp_snapshot *s = uw_session_of(ss);

	return s ? fill(s, st) : -EINVAL;
}
