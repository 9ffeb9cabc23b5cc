// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * tracker.c: the backend-independent part of the dirty tracker: choosing a
 * backend, the pending bitmap and collect().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <sys/mman.h>

#include "snapshot.h"

static const char *const names[UFFDWP_BACKEND_COUNT] = {
	[UFFDWP_BACKEND_AUTO] = "auto",
	[UFFDWP_BACKEND_RING] = "ring",
	[UFFDWP_BACKEND_PAGEMAP_SCAN] = "pagemap-scan",
	[UFFDWP_BACKEND_SOFT_DIRTY] = "soft-dirty",
	[UFFDWP_BACKEND_MPROTECT] = "mprotect",
};

static const struct uw_tracker_ops *const ops[UFFDWP_BACKEND_COUNT] = {
	[UFFDWP_BACKEND_RING] = &uw_ring_ops,
	[UFFDWP_BACKEND_PAGEMAP_SCAN] = &uw_scan_ops,
	[UFFDWP_BACKEND_SOFT_DIRTY] = &uw_softdirty_ops,
	[UFFDWP_BACKEND_MPROTECT] = &uw_mprotect_ops,
};

const char *uffdwp_backend_name(enum uffdwp_backend b)
{
	return (unsigned int)b < UFFDWP_BACKEND_COUNT ? names[b] : NULL;
}

int uffdwp_backend_from_name(const char *name)
{
	for (int b = 0; name && b < UFFDWP_BACKEND_COUNT; b++)
		if (!strcmp(name, names[b]))
			return b;
	return -EINVAL;
}

int uffdwp_backend_available(enum uffdwp_backend b)
{
	struct uffdwp_features f;
	/* A probe that ran out of descriptors or memory cannot say a
	 * backend is missing: that error, not -EOPNOTSUPP. */
	int no = uw_probe(&f) ?: -EOPNOTSUPP;

	switch (b) {
	case UFFDWP_BACKEND_AUTO:
		return 0;
	case UFFDWP_BACKEND_RING:
		/* Overflow recovery needs PAGEMAP_SCAN. */
		return f.wp_ring && f.pagemap_scan ? 0 : no;
	case UFFDWP_BACKEND_PAGEMAP_SCAN:
		return f.wp_async && f.pagemap_scan ? 0 : no;
	case UFFDWP_BACKEND_SOFT_DIRTY:
		if (uw_soft_dirty_in_use())
			return -EBUSY;
		return f.soft_dirty ? 0 : no;
	case UFFDWP_BACKEND_MPROTECT:
		return 0;
	default:
		return -EINVAL;
	}
}

/*
 * AUTO takes the first backend the kernel has (even if it is busy), and
 * only that one: a backend that fails for these regions (-EBUSY from
 * another userfaultfd, say) is an error to report, not a reason to switch
 * silently to one with other costs and side effects.
 */
enum uffdwp_backend uffdwp_backend_choose(void)
{
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++)
		if (uffdwp_backend_available(b) != -EOPNOTSUPP)
			return b;
	return UFFDWP_BACKEND_MPROTECT;
}

#define PM_PRESENT	(1ULL << 63)
#define PM_SWAP		(1ULL << 62)
#define PM_EXCLUSIVE	(1ULL << 56)
#define PM_SOFT_DIRTY	(1ULL << 55)
#define PM_PFN		((1ULL << 55) - 1)
#define PM_BATCH	4096	/* pagemap entries per pread */

int uw_pagemap_open(struct uffdwp_tracker *t)
{
	t->vec_len = PM_BATCH * 8 / sizeof(*t->vec);
	t->vec = uw_alloc(PM_BATCH * 8);
	t->mapped = uw_alloc(t->words * 8);
	t->own = uw_alloc(t->words * 8);
	t->pfn = uw_alloc(t->rs.pages * 8);
	if (!t->vec || !t->mapped || !t->own || !t->pfn)
		return -ENOMEM;
	t->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	return t->pagemap_fd < 0 ? -errno : 0;
}

void uw_pagemap_close(struct uffdwp_tracker *t)
{
	if (t->pagemap_fd >= 0)
		close(t->pagemap_fd);
	t->pagemap_fd = -1;
	uw_free(t->vec, PM_BATCH * 8);
	uw_free(t->mapped, t->words * 8);
	uw_free(t->own, t->words * 8);
	uw_free(t->pfn, t->rs.pages * 8);
	t->pfn = NULL;
	t->vec = NULL;
	t->mapped = t->own = NULL;
	t->vec_len = 0;
}

/*
 * A page's content changes without a write fault when the program discards
 * it (MADV_DONTNEED, MADV_FREE once reclaimed, MADV_REMOVE): it reads as
 * zeroes afterwards.  Its pagemap entry shows it: mapped (present or
 * swapped) before, none after; or a page of its own (present and
 * exclusive, or swapped) before, the shared zero page after (read after
 * the discard); or, where pagemap shows page frames (CAP_SYS_ADMIN), a
 * present page on another frame.  Such a page is reported as written.
 * Fork, KSM, migration and compaction change these too: reported then as
 * well, more than was written.  Without frames, a discarded page read
 * again before the next pass is missed where the kernel gives it a page
 * of its own (no shared zero page) or where it was shared before.
 */
int uw_pagemap_pass(struct uffdwp_tracker *t, bool soft_dirty, bool first)
{
	uint64_t *e = (uint64_t *)t->vec;
	size_t psz = uw_page_size();

	for (size_t i = 0; i < t->rs.nr; i++) {
		size_t pages = t->rs.r[i].len / psz;
		uintptr_t base = (uintptr_t)t->rs.r[i].addr;

		for (size_t done = 0; done < pages;) {
			size_t n = pages - done < PM_BATCH ? pages - done : PM_BATCH;
			off_t off = (off_t)((base / psz + done) * 8);
			ssize_t got = pread(t->pagemap_fd, e, n * 8, off);

			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0)
				return -errno;
			if (got < 8)
				return -EIO;
			n = (size_t)got / 8;
			for (size_t k = 0; k < n; k++) {
				size_t idx = t->rs.first[i] + done + k;
				bool mapped = e[k] & (PM_PRESENT | PM_SWAP);
				bool own = (e[k] & PM_SWAP) ||
					   (e[k] & (PM_PRESENT | PM_EXCLUSIVE)) ==
					   (PM_PRESENT | PM_EXCLUSIVE);
				bool was_mapped = uw_bit_test(t->mapped, idx);
				bool was_own = uw_bit_test(t->own, idx);
				uint64_t pfn = e[k] & PM_PRESENT ? e[k] & PM_PFN : 0;
				bool moved = pfn && t->pfn[idx] && pfn != t->pfn[idx];

				if (!first && ((soft_dirty && (e[k] & PM_SOFT_DIRTY)) ||
					       (was_mapped && !mapped) ||
					       (was_own && !own) || moved))
					uw_bit_set(t->pending, idx);
				t->pfn[idx] = pfn;
				if (mapped != was_mapped)
					atomic_fetch_xor_explicit(&t->mapped[idx / 64],
						1ULL << (idx % 64), memory_order_relaxed);
				if (own != was_own)
					atomic_fetch_xor_explicit(&t->own[idx / 64],
						1ULL << (idx % 64), memory_order_relaxed);
			}
			done += n;
		}
	}
	return 0;
}

static bool foreign(const struct uffdwp_tracker *t)
{
	return t->owner != getpid();
}

bool uw_tracker_foreign(const struct uffdwp_tracker *t)
{
	return foreign(t);
}

/*
 * In a child of fork(): the userfaultfd is the parent's (an ioctl on it
 * acts on the parent's memory: an unregister would end the parent's
 * tracking), and the parent's locks may be held for ever.  Only the
 * child's copies go: its descriptors, its mappings, and (mprotect and
 * soft-dirty) its own memory's protections and its copy of the handler's
 * table.
 */
static void tracker_forget(struct uffdwp_tracker *t)
{
	t->magic = 0;
	if (t->slot >= 0)
		uw_segv_forget(t);
	if (t->backend == UFFDWP_BACKEND_SOFT_DIRTY && t->registered)
		uw_soft_dirty_release();
	/* The ring is not the child's: the kernel maps it VM_DONTCOPY, and
	 * the child may have mapped its own memory at that address since. */
	if (t->uffd >= 0)
		close(t->uffd);
	/* (munmap() rounds the length up to pages: the backends' two
	 * sizes of VEC free alike) */
	uw_free(t->vec, t->vec_len * sizeof(*t->vec));
	t->vec = NULL;
	uw_free(t->faulted, t->words * 8);
	uw_free(t->rearm, t->words * 8);
	uw_pagemap_close(t);
	uw_free(t->pending, t->words * 8);
	uw_regions_fini(&t->rs);
	uw_free(t, (sizeof(*t) + uw_page_size() - 1) / uw_page_size() *
		   uw_page_size());
}

static void tracker_destroy(struct uffdwp_tracker *t)
{
	t->magic = 0;
	if (t->ops)
		t->ops->stop(t);
	uw_pagemap_close(t);
	uw_free(t->pending, t->words * 8);
	uw_regions_fini(&t->rs);
	uw_free(t, (sizeof(*t) + uw_page_size() - 1) / uw_page_size() *
		   uw_page_size());
}

int uffdwp_tracker_new(struct uffdwp_tracker **out,
		       const struct uffdwp_region *regions, size_t nr,
		       enum uffdwp_backend backend)
{
	size_t psz = uw_page_size();
	struct uffdwp_tracker *t;
	bool anon;
	int err;

	if (!out || (unsigned int)backend >= UFFDWP_BACKEND_COUNT ||
	    uw_store_ptr(out, NULL))
		return -EINVAL;
	/* The regions as snapshots check them: mapped (-EFAULT) before
	 * anything is allocated, then of one kind, readable and writable
	 * (-EINVAL). */
	err = uw_regions_mapped(regions, nr);
	if (err)
		return err;
	t = uw_alloc((sizeof(*t) + psz - 1) / psz * psz);
	if (!t)
		return -ENOMEM;
	memset(t, 0, sizeof(*t));
	t->owner = getpid();
	t->uffd = t->pagemap_fd = t->slot = -1;
	err = uw_regions_init(&t->rs, regions, nr);
	if (err)
		goto fail;
	if (backend == UFFDWP_BACKEND_AUTO)
		backend = uffdwp_backend_choose();	/* no other (see there) */
	/* Memory another mprotect or soft-dirty tracker holds read-only is
	 * busy (-EBUSY), not "read-only" (-EINVAL). */
	if ((backend == UFFDWP_BACKEND_MPROTECT ||
	     backend == UFFDWP_BACKEND_SOFT_DIRTY) && uw_segv_overlaps(t))
		err = -EBUSY;
	if (!err)
		err = uw_regions_check_maps(&t->rs, &anon);
	if (err)
		goto fail;
	t->words = (t->rs.pages + 63) / 64;
	t->pending = uw_alloc(t->words * 8);
	if (!t->pending) {
		err = -ENOMEM;
		goto fail;
	}
	err = uffdwp_backend_available(backend);
	if (err)
		goto fail;
	t->backend = backend;
	t->ops = ops[backend];
	err = t->ops->start(t);
	if (err)
		goto fail;	/* destroy calls stop: undoes what start did */
	t->magic = UW_TRACKER_MAGIC;
	*out = t;
	return 0;
fail:
	tracker_destroy(t);
	return err;
}

enum uffdwp_backend uffdwp_tracker_backend(const struct uffdwp_tracker *t)
{
	return t ? t->backend : UFFDWP_BACKEND_AUTO;
}

void uw_mark_range(struct uffdwp_tracker *t, uintptr_t addr, size_t len)
{
	uw_mark_pages(&t->rs, t->pending, addr, len);
}

bool uw_bits_any(_Atomic uint64_t *map, size_t words)
{
	for (size_t w = 0; w < words; w++)
		if (atomic_load_explicit(&map[w], memory_order_relaxed))
			return true;
	return false;
}

/*
 * Rounds: gather only once every page of the last gather has been handed
 * out.  A caller that drains in chunks while writers run then sees a call
 * return fewer than MAX and its loop end; what is written meanwhile waits
 * for the next round, which the call after that starts.  A round whose
 * last call returned exactly MAX pages ends with a call that returns 0.
 */
int uw_tracker_round_start(struct uffdwp_tracker *t)
{
	if (uw_bits_any(t->pending, t->words))
		return 1;
	if (t->round_full) {
		t->round_full = false;
		return 0;
	}
	return t->ops->gather(t) ?: 1;
}

void uw_tracker_round_end(struct uffdwp_tracker *t, size_t n, size_t max)
{
	t->round_full = n && n == max && !uw_bits_any(t->pending, t->words);
}

ssize_t uffdwp_tracker_collect(struct uffdwp_tracker *t, void **pages,
			       size_t max)
{
	size_t n = 0;
	int err;

	if (!t || (!pages && max))
		return -EINVAL;
	if (foreign(t))
		return -ECHILD;
	err = uw_tracker_round_start(t);
	if (err <= 0)
		return err;
	for (size_t w = 0; w < t->words && n < max; w++) {
		uint64_t bits = atomic_load_explicit(&t->pending[w],
						     memory_order_relaxed);

		while (bits && n < max) {
			int b = __builtin_ctzll(bits);

			bits &= bits - 1;
			atomic_fetch_and_explicit(&t->pending[w], ~(1ULL << b),
						  memory_order_relaxed);
			pages[n++] = (void *)uw_page_addr(&t->rs, w * 64 + b);
		}
	}
	uw_tracker_round_end(t, n, max);
	return (ssize_t)n;
}

void uffdwp_tracker_free(struct uffdwp_tracker *t)
{
	if (t && foreign(t))
		tracker_forget(t);
	else if (t)
		tracker_destroy(t);
}
