// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * session-regions.c: adding regions to a session and removing them
 * (uffdwp_session_add_region(), uffdwp_session_remove_region()).
 *
 * Between snapshots a session's per-page arrays (page states, the dirty,
 * huge, set and zeroed bitmaps, the ranks) and the file prefix and sums
 * are indexed by page number over the sorted regions, so a change of
 * regions renumbers pages.  A change builds the arrays of the new layout
 * aside, carries each surviving region's dirty and huge bits over to its
 * new numbers (an added region's pages all dirty: the next delta stores
 * it in full), and swaps them in under the handler's instant lock (and
 * the message read lock), so that no fault or discard is handled against
 * half of it; the old arrays are freed afterwards.  Like an instant, the
 * swap runs on a thread of the library's own (uw_run_aside()): the
 * caller's stack may lie in a protected region.
 *
 * Added: registered before the swap (writes to it raise no fault until
 * the next instant protects it; its pages are dirty anyway).  Removed:
 * unprotected with a wake-up (its waiting writers go on) and unregistered
 * before the swap; a fault read before that and handled after it finds
 * no region and only wakes its writer (snapshot-handler.c).  Either way
 * the next delta records the new regions and carries
 * UFFDWP_FILE_REGIONS_CHANGED (snapfile.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "snapshot.h"

/* The arrays of one layout. */
struct layout {
	struct uw_regions rs;
	_Atomic uint32_t *state;
	size_t state_len;
	_Atomic uint64_t *huge, *zeroed;
	size_t huge_len;
	_Atomic uint64_t *set, *dirty;
	uint64_t *rank;
	size_t words, bitmap_len;
	char *prefix;
	off_t data_off;
	uint64_t *sums;
	size_t sums_len;
};

static size_t round_page(size_t n)
{
	size_t psz = uw_page_size();

	return (n + psz - 1) / psz * psz;
}

static void layout_free(struct layout *l)
{
	uw_free((void *)l->state, l->state_len);
	uw_free((void *)l->huge, l->huge_len);
	uw_free((void *)l->zeroed, l->huge_len);
	uw_free((void *)l->set, l->bitmap_len);
	uw_free((void *)l->dirty, l->bitmap_len);
	uw_free(l->rank, l->bitmap_len);
	uw_free(l->prefix, (size_t)l->data_off);
	uw_free(l->sums, l->sums_len);
	uw_regions_fini(&l->rs);
	memset(l, 0, sizeof(*l));
}

/* Bit I of OLD's page ORIG into NEW's page NOW. */
static void carry(_Atomic uint64_t *to, size_t now,
		  const _Atomic uint64_t *from, size_t orig)
{
	if (uw_bit_test(from, orig))
		uw_bit_set(to, now);
}

/* L: the (empty) arrays for the NR regions R (library memory), every
 * page settled; layout_carry() fills the bitmaps.  0, -EINVAL (overlap)
 * or -ENOMEM. */
static int layout_build(struct layout *l, const struct uffdwp_region *r,
			size_t nr)
{
	size_t psz = uw_page_size();
	int err;

	memset(l, 0, sizeof(*l));
	err = uw_regions_init(&l->rs, r, nr);
	if (err)
		return err;
	l->state_len = round_page(l->rs.pages * sizeof(uint32_t));
	l->huge_len = round_page((l->rs.pages + 63) / 64 * 8);
	l->words = (l->rs.pages + 63) / 64;
	l->bitmap_len = round_page(l->words * 8);
	l->data_off = (off_t)uw_file_data_off(l->rs.nr, l->rs.pages, psz);
	l->sums_len = round_page(uw_file_trailer_len(l->rs.pages));
	l->state = uw_alloc(l->state_len);
	l->huge = uw_alloc(l->huge_len);
	l->zeroed = uw_alloc(l->huge_len);
	l->set = uw_alloc(l->bitmap_len);
	l->dirty = uw_alloc(l->bitmap_len);
	l->rank = uw_alloc(l->bitmap_len);
	l->prefix = uw_alloc((size_t)l->data_off);
	l->sums = uw_alloc(l->sums_len);
	if (!l->state || !l->huge || !l->zeroed || !l->set || !l->dirty ||
	    !l->rank || !l->prefix || !l->sums) {
		layout_free(l);
		return -ENOMEM;
	}
	/* Between snapshots every page is settled (take_set() makes the
	 * next set's pages PENDING). */
	for (size_t i = 0; i < l->rs.pages; i++)
		atomic_store_explicit(&l->state[i], ST_DONE,
				      memory_order_relaxed);
	return 0;
}

/* The dirty and huge bits of L from S (under the instant lock: the
 * handler marks nothing meanwhile). */
static void layout_carry(struct uffdwp_snapshot *s, struct layout *l)
{
	size_t psz = uw_page_size();

	for (size_t j = 0; j < l->rs.nr; j++) {
		size_t n = l->rs.r[j].len / psz, first = l->rs.first[j];
		long old = uw_page_index(&s->rs, (uintptr_t)l->rs.r[j].addr);

		for (size_t i = 0; i < n; i++) {
			if (old < 0) {
				uw_bit_set(l->dirty, first + i);
				continue;
			}
			carry(l->dirty, first + i, s->dirty, (size_t)old + i);
			carry(l->huge, first + i, s->huge, (size_t)old + i);
		}
	}
}

/* Swap L's arrays with S's: afterwards L holds the old ones. */
static void layout_swap(struct uffdwp_snapshot *s, struct layout *l)
{
	struct layout old = {
		.rs = s->rs, .state = s->state, .state_len = s->state_len,
		.huge = s->huge, .zeroed = s->zeroed, .huge_len = s->huge_len,
		.set = s->set, .dirty = s->dirty, .rank = s->rank,
		.words = s->words, .bitmap_len = s->bitmap_len,
		.prefix = s->prefix, .data_off = s->data_off,
		.sums = s->sums, .sums_len = s->sums_len,
	};

	s->rs = l->rs;
	s->state = l->state;
	s->state_len = l->state_len;
	s->huge = l->huge;
	s->zeroed = l->zeroed;
	s->huge_len = l->huge_len;
	s->set = l->set;
	s->dirty = l->dirty;
	s->rank = l->rank;
	s->words = l->words;
	s->bitmap_len = l->bitmap_len;
	s->prefix = l->prefix;
	s->data_off = l->data_off;
	s->sums = l->sums;
	s->sums_len = l->sums_len;
	s->regions_changed = true;
	*l = old;
	pthread_mutex_lock(&s->lock);
	s->st.fixed_bytes = CHUNK + s->state_len + 2 * s->huge_len +
			    s->slots_len + 3 * s->bitmap_len +
			    (size_t)s->data_off + s->sums_len + uw_page_size();
	pthread_mutex_unlock(&s->lock);
}

struct change {
	struct uffdwp_snapshot *s;
	struct layout *l;
	const struct uffdwp_region *gone;	/* remove: this region */
};

/* The swap (and a removed region's release) with the handler held: run
 * aside, touches only the library's memory. */
static int change_held(void *arg)
{
	struct change *c = arg;
	struct uffdwp_snapshot *s = c->s;

	uw_session_hold(s);
	/* Pages the ring logged in async mode join the dirty bits carried
	 * over (best effort: a failed fold leaves its pages to the next). */
	uw_session_fold(s);
	pthread_mutex_lock(&s->read_lock);
	if (c->gone) {
		struct uffdio_range u = {
			.start = (uintptr_t)c->gone->addr,
			.len = c->gone->len,
		};

		/* Best effort: a region unmapped already has nothing to
		 * unprotect (and nobody waiting on it). */
		uw_snap_wp(s, u.start, u.len, false, true);
		uw_snap_ioctl(s, UFFDIO_UNREGISTER, &u);
	}
	layout_carry(s, c->l);
	layout_swap(s, c->l);
	pthread_mutex_unlock(&s->read_lock);
	uw_session_release(s);
	return 0;
}

/* The session's regions with ADD (if not NULL) and without index SKIP
 * (if below nr), in the library's memory; *NR their count. */
static struct uffdwp_region *region_list(struct uffdwp_snapshot *s,
					 const struct uffdwp_region *add,
					 size_t skip, size_t *nr, size_t *len)
{
	struct uffdwp_region *r;
	size_t n = 0;

	*len = round_page((s->rs.nr + 1) * sizeof(*r));
	r = uw_alloc(*len);
	if (!r)
		return NULL;
	for (size_t i = 0; i < s->rs.nr; i++)
		if (i != skip)
			r[n++] = s->rs.r[i];
	if (add)
		r[n++] = *add;
	*nr = n;
	return r;
}

/* Build the new layout from the list and swap it in; 0 or -errno (the
 * session then unchanged, except that a removed region stays removed
 * only when the swap ran). */
static int change(struct uffdwp_snapshot *s, const struct uffdwp_region *add,
		  size_t skip)
{
	struct uffdwp_region *r, *gone = NULL;
	struct change *c;
	struct layout *l;
	size_t nr, len;
	int err;

	r = region_list(s, add, skip, &nr, &len);
	/* The hand-over and the layout in the library's memory. */
	c = uw_alloc(round_page(sizeof(*c) + sizeof(*l) + sizeof(*gone)));
	if (!r || !c) {
		uw_free(r, len);
		uw_free(c, round_page(sizeof(*c) + sizeof(*l) + sizeof(*gone)));
		return -ENOMEM;
	}
	l = (struct layout *)(c + 1);
	gone = (struct uffdwp_region *)(l + 1);
	err = layout_build(l, r, nr);
	uw_free(r, len);
	if (!err) {
		if (skip < s->rs.nr)
			*gone = s->rs.r[skip];
		*c = (struct change){ s, l, skip < s->rs.nr ? gone : NULL };
		err = uw_run_aside(change_held, c);
		/* L holds the old arrays after the swap, the new ones
		 * otherwise: either way they go. */
		layout_free(l);
	}
	uw_free(c, round_page(sizeof(*c) + sizeof(*l) + sizeof(*gone)));
	return err;
}

/* The arguments of add and remove: *S the live session SS, *R the
 * caller's region FROM, reached without a fault, page-aligned and not
 * empty (else -EINVAL); -ECHILD in a child of fork(); else 0. */
static int take_args(struct uffdwp_session *ss,
		     const struct uffdwp_region *from,
		     struct uffdwp_snapshot **s, struct uffdwp_region *r)
{
	size_t psz = uw_page_size();
	uintptr_t a;

	*s = uw_session_of(ss);
	if (!*s || !from || uw_copy_in(r, from, sizeof(*r)))
		return -EINVAL;
	a = (uintptr_t)r->addr;
	if (!a || !r->len || a % psz || r->len % psz || a + r->len <= a)
		return -EINVAL;
	return uw_snap_foreign(*s) ? -ECHILD : 0;
}

int uffdwp_session_add_region(struct uffdwp_session *ss,
			      const struct uffdwp_region *region)
{
	struct uffdwp_snapshot *s;
	struct uffdwp_region r;
	struct uw_regions one = { .nr = 1, .r = &r };
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_WP };
	uintptr_t a;
	bool anon;
	int err;

	err = take_args(ss, region, &s, &r);
	if (err)
		return err;
	/* Mapped (-EFAULT) before anything is allocated. */
	err = uw_regions_mapped(&r, 1);
	if (err)
		return err;
	err = uw_session_idle(s);
	if (err)
		return err;
	a = (uintptr_t)r.addr;
	for (size_t i = 0; i < s->rs.nr; i++)
		if (a < (uintptr_t)s->rs.r[i].addr + s->rs.r[i].len &&
		    (uintptr_t)s->rs.r[i].addr < a + r.len)
			return -EBUSY;
	err = uw_regions_check_maps(&one, &anon);
	if (err)
		return err;
	if (s->rs.nr >= (1u << 20))
		return -ENOMEM;
	/* In sync mode, whose registration refuses memory it cannot track
	 * (async mode would take any file mapping). */
	err = uw_session_sync_now(s);
	if (err)
		return err;
	reg.range.start = a;
	reg.range.len = r.len;
	err = uw_snap_ioctl(s, UFFDIO_REGISTER, &reg);
	if (!err && !(reg.ioctls & (1ULL << _UFFDIO_WRITEPROTECT)))
		err = -EOPNOTSUPP;
	if (!err)
		err = change(s, &r, (size_t)-1);
	if (err) {
		struct uffdio_range u = { .start = a, .len = r.len };

		/* (-EBUSY: another userfaultfd's; ours never was) */
		if (err != -EBUSY)
			uw_snap_ioctl(s, UFFDIO_UNREGISTER, &u);
		uw_session_go_async(s, true);
		return err;
	}
	/* Discarded pages read as zeroes only if every region is private
	 * anonymous memory (unless the flags said which). */
	if (!(s->opts.flags & (UFFDWP_SNAP_DISCARD_ZERO |
			       UFFDWP_SNAP_DISCARD_FAIL)))
		s->discard_zero = s->discard_zero && anon;
	s->anon_only = s->anon_only && anon;
	uw_session_go_async(s, true);
	return 0;
}

int uffdwp_session_remove_region(struct uffdwp_session *ss,
				 const struct uffdwp_region *region)
{
	struct uffdwp_snapshot *s;
	struct uffdwp_region r;
	size_t k;
	bool anon;
	int err;

	err = take_args(ss, region, &s, &r);
	if (err)
		return err;
	for (k = 0; k < s->rs.nr; k++)
		if (s->rs.r[k].addr == r.addr && s->rs.r[k].len == r.len)
			break;
	if (k == s->rs.nr)
		return -ENOENT;
	if (s->rs.nr == 1)
		return -EINVAL;
	err = uw_session_idle(s);
	if (!err)
		err = change(s, NULL, k);
	if (err)
		return err;
	/* Fewer regions: maybe every one left is private anonymous now
	 * (a region of another kind no longer mapped keeps it false). */
	if (!(s->opts.flags & (UFFDWP_SNAP_DISCARD_ZERO |
			       UFFDWP_SNAP_DISCARD_FAIL)) &&
	    !uw_regions_check_maps(&s->rs, &anon))
		s->discard_zero = anon;
	return 0;
}
