// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * tracker.c: the backend-independent part of the dirty tracker: choosing a
 * backend, the pending bitmap and collect().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

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

	uffdwp_probe(&f);
	switch (b) {
	case UFFDWP_BACKEND_AUTO:
		return 0;
	case UFFDWP_BACKEND_RING:
		/* Overflow recovery needs PAGEMAP_SCAN. */
		return f.wp_ring && f.pagemap_scan ? 0 : -EOPNOTSUPP;
	case UFFDWP_BACKEND_PAGEMAP_SCAN:
		return f.wp_async && f.pagemap_scan ? 0 : -EOPNOTSUPP;
	case UFFDWP_BACKEND_SOFT_DIRTY:
		if (uw_soft_dirty_in_use())
			return -EBUSY;
		return f.soft_dirty ? 0 : -EOPNOTSUPP;
	case UFFDWP_BACKEND_MPROTECT:
		return 0;
	default:
		return -EINVAL;
	}
}

enum uffdwp_backend uffdwp_backend_choose(void)
{
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++)
		if (!uffdwp_backend_available(b))
			return b;
	return UFFDWP_BACKEND_MPROTECT;
}

static void tracker_destroy(struct uffdwp_tracker *t)
{
	if (t->ops)
		t->ops->stop(t);
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
	int err;

	if (!out || (unsigned int)backend >= UFFDWP_BACKEND_COUNT)
		return -EINVAL;
	*out = NULL;
	t = uw_alloc((sizeof(*t) + psz - 1) / psz * psz);
	if (!t)
		return -ENOMEM;
	memset(t, 0, sizeof(*t));
	t->uffd = t->pagemap_fd = t->slot = -1;
	err = uw_regions_init(&t->rs, regions, nr);
	if (err)
		goto fail;
	t->words = (t->rs.pages + 63) / 64;
	t->pending = uw_alloc(t->words * 8);
	if (!t->pending) {
		err = -ENOMEM;
		goto fail;
	}
	err = -EOPNOTSUPP;
	for (int b = UFFDWP_BACKEND_RING; b < UFFDWP_BACKEND_COUNT; b++) {
		if (backend != UFFDWP_BACKEND_AUTO && (int)backend != b)
			continue;
		err = uffdwp_backend_available(b);
		if (err)
			continue;
		t->backend = b;
		t->ops = ops[b];
		err = t->ops->start(t);
		if (!err)
			break;
		/* Undo what start did, then try the next one (AUTO). */
		t->ops->stop(t);
		t->ops = NULL;
	}
	if (err)
		goto fail;
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

ssize_t uffdwp_tracker_collect(struct uffdwp_tracker *t, void **pages,
			       size_t max)
{
	size_t n = 0;
	int err;

	if (!t || (!pages && max))
		return -EINVAL;
	err = t->ops->gather(t);
	if (err)
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
	return (ssize_t)n;
}

void uffdwp_tracker_free(struct uffdwp_tracker *t)
{
	if (t)
		tracker_destroy(t);
}
