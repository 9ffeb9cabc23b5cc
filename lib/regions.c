// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/* regions.c: validating and indexing the caller's list of regions. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "snapshot.h"

static int cmp_region(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)((const struct uffdwp_region *)a)->addr;
	uintptr_t y = (uintptr_t)((const struct uffdwp_region *)b)->addr;

	return x < y ? -1 : x > y;
}

static bool region_ok(const struct uffdwp_region *r)
{
	size_t psz = uw_page_size();
	uintptr_t a = (uintptr_t)r->addr;

	return a && r->len && !(a % psz) && !(r->len % psz) &&
	       a + r->len > a;
}

int uw_regions_init(struct uw_regions *rs, const struct uffdwp_region *r,
		    size_t nr)
{
	size_t psz = uw_page_size();
	char *mem;
	int err;

	memset(rs, 0, sizeof(*rs));
	if (!r || nr == 0 || nr > (1u << 20))
		return -EINVAL;
	rs->alloc_len = (nr * (sizeof(*rs->r) + sizeof(*rs->first)) + psz - 1)
			/ psz * psz;
	mem = uw_alloc(rs->alloc_len);
	if (!mem)
		return -ENOMEM;
	rs->r = (struct uffdwp_region *)mem;
	rs->first = (size_t *)(mem + nr * sizeof(*rs->r));
	rs->nr = nr;
	/* The caller's array may be anything: copied without a fault. */
	err = uw_copy_in(rs->r, r, nr * sizeof(*r));
	for (size_t i = 0; i < nr && !err; i++)
		if (!region_ok(&rs->r[i]))
			err = -EINVAL;
	if (err) {
		uw_regions_fini(rs);
		return err;
	}
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

int uw_regions_mapped(const struct uffdwp_region *r, size_t nr)
{
	size_t psz = uw_page_size();
	unsigned char vec[4096];
	struct uffdwp_region c[32];

	if (!r || nr == 0 || nr > (1u << 20))
		return -EINVAL;
	/* The caller's array may be anything: read without a fault, a few
	 * at a time onto our stack (nothing may be allocated yet). */
	for (size_t i = 0; i < nr; i++) {
		if (i % 32 == 0 &&
		    uw_copy_in(c, r + i, (nr - i < 32 ? nr - i : 32) *
					 sizeof(*r)))
			return -EINVAL;
		if (!region_ok(&c[i % 32]))
			return -EINVAL;
	}
	for (size_t i = 0; i < nr; i++) {
		uintptr_t a, end;

		if (i % 32 == 0 &&
		    uw_copy_in(c, r + i, (nr - i < 32 ? nr - i : 32) *
					 sizeof(*r)))
			return -EINVAL;
		a = (uintptr_t)c[i % 32].addr;
		end = a + c[i % 32].len;

		while (a < end) {
			size_t n = (end - a) / psz;

			if (n > sizeof(vec))
				n = sizeof(vec);
			if (mincore((void *)a, n * psz, vec))
				return errno == ENOMEM ? -EFAULT : -errno;
			a += n * psz;
		}
	}
	return 0;
}

/* One line of /proc/self/maps: "start-end perms offset dev inode path". */
struct vma_line {
	uintptr_t start, end;
	bool readable, writable, shared;
	unsigned long dev_major, dev_minor, inode;
};

static bool parse_vma(const char *l, struct vma_line *v)
{
	char *e;

	v->start = strtoul(l, &e, 16);
	if (*e != '-')
		return false;
	v->end = strtoul(e + 1, &e, 16);
	if (*e != ' ' || strlen(e) < 6)
		return false;
	v->readable = e[1] == 'r';
	v->writable = e[2] == 'w';
	v->shared = e[4] == 's';
	strtoul(e + 5, &e, 16);			/* offset */
	v->dev_major = strtoul(e, &e, 16);
	if (*e != ':')
		return false;
	v->dev_minor = strtoul(e + 1, &e, 16);
	v->inode = strtoul(e, &e, 10);
	return true;
}

struct maps_walk {
	const struct uw_regions *rs;
	size_t i;			/* region being covered */
	uintptr_t cursor;		/* its first address not covered yet */
	struct vma_line kind;		/* the mapping its first page is in */
	bool anon_private;
	int err;
};

/* Account for one mapping; walks are in address order. */
static void walk_vma(struct maps_walk *w, const struct vma_line *v)
{
	while (!w->err && w->i < w->rs->nr) {
		const struct uffdwp_region *r = &w->rs->r[w->i];
		uintptr_t rend = (uintptr_t)r->addr + r->len;

		if (v->end <= w->cursor)
			return;
		if (v->start > w->cursor) {
			w->err = -EFAULT;	/* a hole in the region */
			return;
		}
		if (!v->readable || !v->writable) {
			w->err = -EINVAL;
			return;
		}
		if (w->cursor == (uintptr_t)r->addr)
			w->kind = *v;
		else if (v->shared != w->kind.shared ||
			 v->inode != w->kind.inode ||
			 v->dev_major != w->kind.dev_major ||
			 v->dev_minor != w->kind.dev_minor) {
			w->err = -EINVAL;
			return;
		}
		w->anon_private &= !v->shared && !v->inode;
		if (v->end < rend) {
			w->cursor = v->end;
			return;
		}
		if (++w->i < w->rs->nr)
			w->cursor = (uintptr_t)w->rs->r[w->i].addr;
	}
}

int uw_regions_check_maps(const struct uw_regions *rs, bool *anon_private)
{
	struct maps_walk w = { rs, 0, (uintptr_t)rs->r[0].addr, { 0 }, true,
			       0 };
	char buf[8192];
	size_t have = 0;
	bool skipping = false;		/* in a line longer than BUF */
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);

	*anon_private = false;
	if (fd < 0)
		return 0;
	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
		char *l = buf, *nl;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			/* Unreadable: the check is skipped, as without /proc. */
			close(fd);
			return 0;
		}
		if (n == 0)
			break;
		have += (size_t)n;
		buf[have] = 0;
		while ((nl = memchr(l, '\n', have - (size_t)(l - buf)))) {
			struct vma_line v;

			*nl = 0;
			if (!skipping && parse_vma(l, &v))
				walk_vma(&w, &v);
			skipping = false;
			l = nl + 1;
		}
		have -= (size_t)(l - buf);
		memmove(buf, l, have);
		if (have == sizeof(buf) - 1) {
			/* A path this long: its fields are in BUF. */
			struct vma_line v;

			if (!skipping && parse_vma(buf, &v))
				walk_vma(&w, &v);
			skipping = true;
			have = 0;
		}
	}
	close(fd);
	if (!w.err && w.i < rs->nr)
		w.err = -EFAULT;
	*anon_private = !w.err && w.anon_private;
	return w.err;
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

static bool holds(const struct uw_regions *rs, uintptr_t a, size_t len)
{
	for (size_t i = 0; i < rs->nr; i++) {
		uintptr_t r = (uintptr_t)rs->r[i].addr;

		if (a < r + rs->r[i].len && r < a + len)
			return true;
	}
	return false;
}

static __thread char tls_mark;

bool uw_regions_hold_own_thread(const struct uw_regions *rs)
{
	volatile char here = 0;
	pthread_attr_t at;
	void *stack;
	size_t size;
	bool hit = holds(rs, (uintptr_t)&here, 1) ||
		   holds(rs, (uintptr_t)&tls_mark, 1) ||
		   holds(rs, (uintptr_t)pthread_self(), 1);

	if (!hit && !pthread_getattr_np(pthread_self(), &at)) {
		if (!pthread_attr_getstack(&at, &stack, &size))
			hit = holds(rs, (uintptr_t)stack, size);
		pthread_attr_destroy(&at);
	}
	return hit;
}
