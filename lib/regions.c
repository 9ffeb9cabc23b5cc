// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/* regions.c: validating and indexing the caller's list of regions. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "internal.h"

static int cmp_region(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)((const struct uffdwp_region *)a)->addr;
	uintptr_t y = (uintptr_t)((const struct uffdwp_region *)b)->addr;

	return x < y ? -1 : x > y;
}

int uw_regions_init(struct uw_regions *rs, const struct uffdwp_region *r,
		    size_t nr)
{
	size_t psz = uw_page_size();
	char *mem;

	memset(rs, 0, sizeof(*rs));
	if (!r || nr == 0 || nr > (1u << 20))
		return -EINVAL;
	for (size_t i = 0; i < nr; i++) {
		uintptr_t a = (uintptr_t)r[i].addr;

		if (!a || !r[i].len || a % psz || r[i].len % psz ||
		    a + r[i].len < a)
			return -EINVAL;
	}
	rs->alloc_len = (nr * (sizeof(*rs->r) + sizeof(*rs->first)) + psz - 1)
			/ psz * psz;
	mem = uw_alloc(rs->alloc_len);
	if (!mem)
		return -ENOMEM;
	rs->r = (struct uffdwp_region *)mem;
	rs->first = (size_t *)(mem + nr * sizeof(*rs->r));
	rs->nr = nr;
	memcpy(rs->r, r, nr * sizeof(*r));
	qsort(rs->r, nr, sizeof(*rs->r), cmp_region);
	for (size_t i = 0; i < nr; i++) {
		if (i && (uintptr_t)rs->r[i - 1].addr + rs->r[i - 1].len >
			 (uintptr_t)rs->r[i].addr) {
			uw_regions_fini(rs);
			return -EINVAL;
		}
		rs->first[i] = rs->pages;
		rs->pages += rs->r[i].len / psz;
	}
	return 0;
}

void uw_regions_fini(struct uw_regions *rs)
{
	uw_free(rs->r, rs->alloc_len);
	memset(rs, 0, sizeof(*rs));
}

long uw_page_index(const struct uw_regions *rs, uintptr_t addr)
{
	size_t lo = 0, hi = rs->nr;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		uintptr_t a = (uintptr_t)rs->r[mid].addr;

		if (addr < a)
			hi = mid;
		else if (addr >= a + rs->r[mid].len)
			lo = mid + 1;
		else
			return (long)(rs->first[mid] + (addr - a) / uw_page_size());
	}
	return -1;
}

uintptr_t uw_page_addr(const struct uw_regions *rs, size_t idx)
{
	size_t lo = 0, hi = rs->nr;

	/* The last region whose first page is <= idx. */
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;

		if (rs->first[mid] <= idx)
			lo = mid;
		else
			hi = mid;
	}
	return (uintptr_t)rs->r[lo].addr + (idx - rs->first[lo]) * uw_page_size();
}

int uw_populate_range(uintptr_t addr, size_t len)
{
	volatile const char *p = (const char *)addr;
	size_t psz = uw_page_size();

#ifdef MADV_POPULATE_READ
	if (!madvise((void *)addr, len, MADV_POPULATE_READ))
		return 0;
	if (errno != EINVAL)
		return -errno;
#endif
	for (size_t off = 0; off < len; off += psz)
		(void)p[off];
	return 0;
}

int uw_populate_read(const struct uw_regions *rs)
{
	for (size_t i = 0; i < rs->nr; i++) {
		int err = uw_populate_range((uintptr_t)rs->r[i].addr,
					    rs->r[i].len);

		if (err)
			return err;
	}
	return 0;
}

int uw_scan_regions(int pagemap_fd, const struct uw_regions *rs,
		    uint64_t flags, uint64_t mask, struct page_region *vec,
		    size_t vec_len,
		    void (*fn)(void *arg, uintptr_t start, uintptr_t end),
		    void *arg)
{
	for (size_t i = 0; i < rs->nr; i++) {
		uintptr_t start = (uintptr_t)rs->r[i].addr;
		uintptr_t end = start + rs->r[i].len;

		while (start < end) {
			struct pm_scan_arg a = {
				.size = sizeof(a),
				.flags = flags,
				.start = start,
				.end = end,
				.vec = (uintptr_t)vec,
				.vec_len = vec_len,
				.category_mask = mask,
				.return_mask = mask,
			};
			int n = ioctl(pagemap_fd, PAGEMAP_SCAN, &a);

			if (n < 0) {
				if (errno == EINTR || errno == EAGAIN)
					continue;
				return -errno;
			}
			for (int k = 0; k < n; k++)
				fn(arg, vec[k].start, vec[k].end);
			if (a.walk_end <= start)
				return -EIO;
			start = a.walk_end;
		}
	}
	return 0;
}

void uw_mark_pages(const struct uw_regions *rs, _Atomic uint64_t *map,
		   uintptr_t addr, size_t len)
{
	size_t psz = uw_page_size();

	addr &= ~(uintptr_t)(psz - 1);
	for (uintptr_t a = addr; a < addr + len; a += psz) {
		long idx = uw_page_index(rs, a);

		if (idx >= 0)
			uw_bit_set(map, (size_t)idx);
	}
}
