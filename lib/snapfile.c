// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapfile.c: the snapshot file format, written by sessions and read back
 * by uffdwp_snapshot_read_info() and uffdwp_snapshot_load().
 *
 *   struct uw_file_header (64 bytes)
 *   NREGIONS x { u64 addr; u64 len; }	in address order
 *   bitmap: (PAGES_TOTAL + 63) / 64 u64	bit i set: page i is stored
 *   u64 sum of the above			(version 2)
 *   zeroes up to a multiple of PAGE_SIZE
 *   the PAGES stored pages, in page-index order
 *   PAGES x u64: each stored page's sum	(version 2)
 *   u64 sum of those sums, "UFFDWPCK"		(version 2)
 *
 * Page index i counts the pages of every region in address order.  Every
 * field is in the writer's byte order; a reader of the other order sees an
 * unknown version and refuses the file.  Version 2 adds a checksum per
 * record (the prefix, each page, the table of sums): a byte changed
 * anywhere fails a load with -EBADMSG.  Version 1 files (no sums) are
 * still read, unchecked.  Version 3 is version 2 with FLAGS in use:
 * UFFDWP_FILE_REGIONS_CHANGED marks a delta whose regions differ from the
 * previous file's (a session's regions were added or removed: every page
 * of a region new since then is stored).  Only such a delta is written
 * as version 3, so that a reader from before it refuses it
 * (-EPROTONOSUPPORT) rather than applying it to the wrong layout; every
 * other file stays version 2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snapshot.h"

#define MAX_REGIONS	(1u << 20)
#define MAX_PAGES	(1ULL << 40)

/* The prefix's length before its sum; and the offset of the first page. */
static size_t meta_end(size_t nregions, size_t pages_total)
{
	return sizeof(struct uw_file_header) + nregions * 16 +
	       (pages_total + 63) / 64 * 8;
}

static size_t data_off(uint32_t version, size_t nregions, size_t pages_total,
		       size_t psz)
{
	size_t n = meta_end(nregions, pages_total) + (version >= 2 ? 8 : 0);

	return (n + psz - 1) / psz * psz;
}

size_t uw_file_data_off(size_t nregions, size_t pages_total, size_t psz)
{
	/* (versions 2 and 3 lay out alike) */
	return data_off(UW_FILE_VERSION, nregions, pages_total, psz);
}

uint64_t uw_file_sum(uint64_t k, const void *p, size_t len)
{
	const uint64_t *w = p;
	uint64_t h = (k + 1) * 0x9E3779B97F4A7C15ULL ^ len;

	/* each step a bijection of H for a given word, and of the word for
	 * a given H: one changed word always changes the result */
	for (size_t i = 0; i < len / 8; i++) {
		h = (h ^ w[i]) * 0xC2B2AE3D27D4EB4FULL;
		h = h << 29 | h >> 35;
	}
	h ^= h >> 33;
	h *= 0xFF51AFD7ED558CCDULL;
	return h ^ (h >> 33);
}

void uw_file_trailer(char *buf, const uint64_t *sums, uint64_t pages)
{
	uint64_t all = uw_file_sum(~0ULL, sums, (size_t)pages * 8);

	if (buf != (const char *)sums)
		memcpy(buf, sums, (size_t)pages * 8);
	memcpy(buf + pages * 8, &all, 8);
	memcpy(buf + pages * 8 + 8, UW_FILE_CK_MAGIC, 8);
}

void uw_file_prefix(char *buf, const struct uw_regions *rs,
		    const _Atomic uint64_t *map, uint32_t kind, uint32_t flags,
		    uint64_t session, uint64_t epoch, uint64_t pages)
{
	size_t psz = uw_page_size(), words = (rs->pages + 63) / 64;
	struct uw_file_header h = {
		.magic = UW_FILE_MAGIC,
		.version = flags ? UW_FILE_VERSION_FLAGS : UW_FILE_VERSION,
		.header_len = sizeof(h),
		.page_size = (uint32_t)psz,
		.kind = kind,
		.nregions = (uint32_t)rs->nr,
		.flags = flags,
		.session = session,
		.epoch = epoch,
		.pages_total = rs->pages,
		.pages = pages,
	};
	uint64_t *rg = (uint64_t *)(buf + sizeof(h)), *bm = rg + 2 * rs->nr;

	memset(buf, 0, uw_file_data_off(rs->nr, rs->pages, psz));
	memcpy(buf, &h, sizeof(h));
	for (size_t i = 0; i < rs->nr; i++) {
		rg[2 * i] = (uintptr_t)rs->r[i].addr;
		rg[2 * i + 1] = rs->r[i].len;
	}
	for (size_t w = 0; w < words; w++)
		bm[w] = !map ? ~0ULL :
			atomic_load_explicit(&map[w], memory_order_relaxed);
	/* A full map (MAP NULL) has no bits past the last page. */
	if (!map && rs->pages % 64)
		bm[words - 1] = (1ULL << (rs->pages % 64)) - 1;
	{
		size_t end = meta_end(rs->nr, rs->pages);
		uint64_t sum = uw_file_sum(0, buf, end);

		memcpy(buf + end, &sum, 8);
	}
}

/* LEN bytes from FD into P: at OFF with pread(2), or with read(2) from
 * the current offset when OFF < 0.  -EBADMSG at the end of the file. */
static int get(int fd, void *p, size_t len, off_t off)
{
	char *c = p;

	while (len) {
		ssize_t n = off < 0 ? read(fd, c, len) : pread(fd, c, len, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EBADMSG;
		c += n;
		len -= (size_t)n;
		if (off >= 0)
			off += n;
	}
	return 0;
}

static int check_header(const struct uw_file_header *h)
{
	if (memcmp(h->magic, UW_FILE_MAGIC, sizeof(h->magic)))
		return -EBADMSG;
	if (h->version != UW_FILE_VERSION && h->version != 1 &&
	    h->version != UW_FILE_VERSION_FLAGS)
		return -EPROTONOSUPPORT;
	if (h->header_len != sizeof(*h) ||
	    (h->flags && h->version < UW_FILE_VERSION_FLAGS) ||
	    (h->flags & ~UFFDWP_FILE_REGIONS_CHANGED) ||
	    (h->flags && h->kind != UFFDWP_FILE_DELTA) ||
	    h->kind > UFFDWP_FILE_DELTA || h->page_size < 512 ||
	    (h->page_size & (h->page_size - 1)) || !h->nregions ||
	    h->nregions > MAX_REGIONS || h->pages_total > MAX_PAGES ||
	    h->pages > h->pages_total)
		return -EBADMSG;
	return 0;
}

/* The recorded regions RG (NR pairs): page-aligned, non-empty, ascending,
 * not overlapping, PAGES_TOTAL pages in all. */
static int check_regions(const struct uw_file_header *h, const uint64_t *rg)
{
	uint64_t pages = 0;

	for (uint32_t i = 0; i < h->nregions; i++) {
		uint64_t a = rg[2 * i], len = rg[2 * i + 1];

		if (!a || !len || a % h->page_size || len % h->page_size ||
		    a + len < a || (i && rg[2 * i - 2] + rg[2 * i - 1] > a))
			return -EBADMSG;
		pages += len / h->page_size;
	}
	return pages == h->pages_total ? 0 : -EBADMSG;
}

/* PREFIX (the header, regions and bitmap, then their sum) checks out. */
static bool prefix_ok(const void *prefix, const struct uw_file_header *h)
{
	size_t end = meta_end(h->nregions, h->pages_total);
	uint64_t sum;

	memcpy(&sum, (const char *)prefix + end, 8);
	return sum == uw_file_sum(0, prefix, end);
}

static void fill_info(const struct uw_file_header *h,
		      struct uffdwp_snapshot_info *info)
{
	memset(info, 0, sizeof(*info));
	info->version = h->version;
	info->page_size = h->page_size;
	info->kind = h->kind;
	info->nregions = h->nregions;
	info->session = h->session;
	info->epoch = h->epoch;
	info->pages_total = h->pages_total;
	info->pages = h->pages;
	info->flags = h->flags;
	info->file_len = data_off(h->version, h->nregions, h->pages_total,
				  h->page_size) +
			 h->pages * h->page_size +
			 (h->version >= 2 ? uw_file_trailer_len(h->pages) : 0);
}

int uffdwp_snapshot_read_info(int fd, struct uffdwp_snapshot_info *info,
			      struct uffdwp_region *regions, size_t max)
{
	struct uw_file_header h;
	size_t rg_len;
	uint64_t *rg;
	off_t pos;
	int err;

	if (!info || (!regions && max))
		return -EINVAL;
	pos = lseek(fd, 0, SEEK_CUR);
	if (pos < 0)
		return -errno;
	err = get(fd, &h, sizeof(h), pos);
	if (!err)
		err = check_header(&h);
	if (err)
		return err;
	/* A header promising more than the file holds is not believed
	 * (nor allocated for). */
	{
		struct stat st;

		if (!fstat(fd, &st) && S_ISREG(st.st_mode) &&
		    (uint64_t)st.st_size < (uint64_t)pos +
		    data_off(h.version, h.nregions, h.pages_total,
			     h.page_size))
			return -EBADMSG;
	}
	/* The whole prefix (version 2: to check its sum) or the regions. */
	rg_len = h.version >= 2 ? meta_end(h.nregions, h.pages_total) + 8 :
				  sizeof(h) + h.nregions * 16;
	rg = uw_alloc(rg_len);
	if (!rg)
		return -ENOMEM;
	err = get(fd, rg, rg_len, pos);
	if (!err && h.version >= 2 && !prefix_ok(rg, &h))
		err = -EBADMSG;
	/* (the header as read again: the sum covers it) */
	if (!err)
		memcpy(&h, rg, sizeof(h));
	if (!err)
		err = check_regions(&h, rg + sizeof(h) / 8);
	for (size_t i = 0; !err && i < max && i < h.nregions; i++) {
		regions[i].addr = (void *)(uintptr_t)rg[8 + 2 * i];
		regions[i].len = rg[8 + 2 * i + 1];
	}
	uw_free(rg, rg_len);
	if (err)
		return err;
	fill_info(&h, info);
	return (int)h.nregions;
}

/* [A, A + LEN) and [P, P + PLEN) share a byte. */
static bool overlaps(uint64_t a, uint64_t len, const void *p, size_t plen)
{
	return a < (uintptr_t)p + plen && (uintptr_t)p < a + len;
}

/* Read the pages of region I (page indices FIRST...) that MAP stores into
 * TO, in runs; for version 2 note each page's sum in SUMS at its position
 * (*K counts the pages stored before). */
static int load_region(int fd, const struct uw_file_header *h,
		       const uint64_t *map, uint64_t first, uint64_t len,
		       char *to, uint64_t *sums, uint64_t *k)
{
	uint64_t n = len / h->page_size;

	for (uint64_t i = 0; i < n;) {
		uint64_t j = i, b = first + i;
		int err;

		if (!(map[b / 64] >> (b % 64) & 1)) {
			i++;
			continue;
		}
		while (j < n && (map[(first + j) / 64] >> ((first + j) % 64) & 1))
			j++;
		err = get(fd, to + i * h->page_size, (j - i) * h->page_size, -1);
		if (err)
			return err;
		for (uint64_t p = i; sums && p < j; p++, (*k)++)
			sums[*k] = uw_file_sum(*k + 1, to + p * h->page_size,
					       h->page_size);
		i = j;
	}
	return 0;
}

int uffdwp_snapshot_load(int fd, const struct uffdwp_region *dst, size_t nr,
			 const struct uffdwp_snapshot_info *prev,
			 struct uffdwp_snapshot_info *info)
{
	struct uffdwp_region *to = NULL;
	struct uw_file_header h;
	size_t words, meta_len, pad, to_len = 0, sums_len = 0;
	uint64_t *meta = NULL, *rg, *map, set = 0, first = 0, k = 0;
	uint64_t *sums = NULL;
	bool v2;
	int err;

	if ((dst == NULL) != (nr == 0) || nr > MAX_REGIONS)
		return -EINVAL;
	err = get(fd, &h, sizeof(h), -1);
	if (!err)
		err = check_header(&h);
	if (err)
		return err;
	v2 = h.version >= 2;
	/* A delta follows PREV, over the same regions unless it says they
	 * changed. */
	if (h.kind == UFFDWP_FILE_DELTA &&
	    (!prev || prev->session != h.session ||
	     prev->epoch + 1 != h.epoch ||
	     (prev->pages_total != h.pages_total &&
	      !(h.flags & UFFDWP_FILE_REGIONS_CHANGED))))
		return -ESTALE;
	if (dst && nr != h.nregions)
		return -EINVAL;
	words = (h.pages_total + 63) / 64;
	/* header (again, for the sum), regions, bitmap, and its sum */
	meta_len = sizeof(h) + (h.nregions * 2 + words) * 8 + (v2 ? 8 : 0);
	meta = uw_alloc(meta_len);
	if (!meta)
		return -ENOMEM;
	memcpy(meta, &h, sizeof(h));
	rg = meta + sizeof(h) / 8;
	map = rg + 2 * h.nregions;
	err = get(fd, rg, meta_len - sizeof(h), -1);
	if (!err && v2 && !prefix_ok(meta, &h))
		err = -EBADMSG;
	if (!err)
		err = check_regions(&h, rg);
	/* The caller's DST without a fault: a bad pointer is -EINVAL. */
	if (!err && dst) {
		to_len = nr * sizeof(*to);
		to = uw_alloc(to_len);
		err = !to ? -ENOMEM : uw_copy_in(to, dst, to_len);
	}
	for (size_t i = 0; !err && to && i < nr; i++)
		if (!to[i].addr || to[i].len != rg[2 * i + 1])
			err = -EINVAL;
	/* Recorded addresses may lie where nothing of the caller's is any
	 * more and our own buffers landed: never load into those. */
	for (uint32_t i = 0; !err && !to && i < h.nregions; i++)
		if (overlaps(rg[2 * i], rg[2 * i + 1], meta, meta_len))
			err = -EFAULT;
	for (size_t w = 0; !err && w < words; w++)
		set += (uint64_t)__builtin_popcountll(map[w]);
	if (!err && (set != h.pages ||
		     (h.pages_total % 64 &&
		      map[words - 1] >> (h.pages_total % 64))))
		err = -EBADMSG;
	if (!err && v2) {
		sums_len = uw_file_trailer_len(h.pages);
		sums = uw_alloc(sums_len * 2);
		if (!sums)
			err = -ENOMEM;
	}
	/* Skip the padding up to the first page. */
	pad = data_off(h.version, h.nregions, h.pages_total, h.page_size) -
	      meta_len;
	if (!err && pad) {
		char *scratch = uw_alloc(pad);

		err = scratch ? get(fd, scratch, pad, -1) : -ENOMEM;
		/* version 2: zeroes, or the file was changed */
		for (size_t i = 0; !err && v2 && i < pad; i++)
			if (scratch[i])
				err = -EBADMSG;
		if (scratch)
			uw_free(scratch, pad);
	}
	for (uint32_t i = 0; !err && !to && sums && i < h.nregions; i++)
		if (overlaps(rg[2 * i], rg[2 * i + 1], sums, sums_len * 2))
			err = -EFAULT;
	for (uint32_t i = 0; !err && i < h.nregions; i++) {
		char *at = to ? to[i].addr : (char *)(uintptr_t)rg[2 * i];

		err = load_region(fd, &h, map, first, rg[2 * i + 1], at, sums,
				  &k);
		first += rg[2 * i + 1] / h.page_size;
	}
	/* Version 2: the sums the writer recorded, and theirs. */
	if (!err && v2) {
		char *want = (char *)sums + sums_len;

		err = get(fd, want, sums_len, -1);
		uw_file_trailer((char *)sums, sums, h.pages);
		if (!err && memcmp(sums, want, sums_len))
			err = -EBADMSG;
	}
	uw_free(sums, sums_len * 2);
	uw_free(to, to_len);
	uw_free(meta, meta_len);
	if (!err && info)
		fill_info(&h, info);
	return err;
}
