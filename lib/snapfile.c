// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapfile.c: the snapshot file format, written by sessions and read back
 * by uffdwp_snapshot_read_info() and uffdwp_snapshot_load().
 *
 *   struct uw_file_header (64 bytes)
 *   NREGIONS x { u64 addr; u64 len; }	in address order
 *   bitmap: (PAGES_TOTAL + 63) / 64 u64	bit i set: page i is stored
 *   zeroes up to a multiple of PAGE_SIZE
 *   the PAGES stored pages, in page-index order
 *
 * Page index i counts the pages of every region in address order.  Every
 * field is in the writer's byte order; a reader of the other order sees an
 * unknown version and refuses the file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define MAX_REGIONS	(1u << 20)
#define MAX_PAGES	(1ULL << 40)

size_t uw_file_data_off(size_t nregions, size_t pages_total, size_t psz)
{
	size_t n = sizeof(struct uw_file_header) + nregions * 16 +
		   (pages_total + 63) / 64 * 8;

	return (n + psz - 1) / psz * psz;
}

void uw_file_prefix(char *buf, const struct uw_regions *rs,
		    const _Atomic uint64_t *map, uint32_t kind,
		    uint64_t session, uint64_t epoch, uint64_t pages)
{
	size_t psz = uw_page_size(), words = (rs->pages + 63) / 64;
	struct uw_file_header h = {
		.magic = UW_FILE_MAGIC,
		.version = UW_FILE_VERSION,
		.header_len = sizeof(h),
		.page_size = (uint32_t)psz,
		.kind = kind,
		.nregions = (uint32_t)rs->nr,
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
	if (h->version != UW_FILE_VERSION)
		return -EPROTONOSUPPORT;
	if (h->header_len != sizeof(*h) || h->flags ||
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
	info->file_len = uw_file_data_off(h->nregions, h->pages_total,
					  h->page_size) +
			 h->pages * h->page_size;
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
	rg_len = h.nregions * 16;
	rg = uw_alloc(rg_len);
	if (!rg)
		return -ENOMEM;
	err = get(fd, rg, rg_len, pos + (off_t)sizeof(h));
	if (!err)
		err = check_regions(&h, rg);
	for (size_t i = 0; !err && i < max && i < h.nregions; i++) {
		regions[i].addr = (void *)(uintptr_t)rg[2 * i];
		regions[i].len = rg[2 * i + 1];
	}
	uw_free(rg, rg_len);
	if (err)
		return err;
	fill_info(&h, info);
	return (int)h.nregions;
}

/* Read the pages of region I (page indices FIRST...) that MAP stores into
 * TO, in runs. */
static int load_region(int fd, const struct uw_file_header *h,
		       const uint64_t *map, uint64_t first, uint64_t len,
		       char *to)
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
		i = j;
	}
	return 0;
}

int uffdwp_snapshot_load(int fd, const struct uffdwp_region *dst, size_t nr,
			 const struct uffdwp_snapshot_info *prev,
			 struct uffdwp_snapshot_info *info)
{
	struct uw_file_header h;
	size_t words, meta_len, pad;
	uint64_t *meta = NULL, *rg, *map, set = 0, first = 0;
	int err;

	if ((dst == NULL) != (nr == 0))
		return -EINVAL;
	err = get(fd, &h, sizeof(h), -1);
	if (!err)
		err = check_header(&h);
	if (err)
		return err;
	if (h.kind == UFFDWP_FILE_DELTA &&
	    (!prev || prev->session != h.session ||
	     prev->epoch + 1 != h.epoch || prev->pages_total != h.pages_total))
		return -ESTALE;
	if (dst && nr != h.nregions)
		return -EINVAL;
	words = (h.pages_total + 63) / 64;
	meta_len = (h.nregions * 2 + words) * 8;
	meta = uw_alloc(meta_len);
	if (!meta)
		return -ENOMEM;
	rg = meta;
	map = meta + 2 * h.nregions;
	err = get(fd, meta, meta_len, -1);
	if (!err)
		err = check_regions(&h, rg);
	for (size_t i = 0; !err && dst && i < nr; i++)
		if (!dst[i].addr || dst[i].len != rg[2 * i + 1])
			err = -EINVAL;
	for (size_t w = 0; !err && w < words; w++)
		set += (uint64_t)__builtin_popcountll(map[w]);
	if (!err && (set != h.pages ||
		     (h.pages_total % 64 &&
		      map[words - 1] >> (h.pages_total % 64))))
		err = -EBADMSG;
	/* Skip the padding up to the first page. */
	pad = uw_file_data_off(h.nregions, h.pages_total, h.page_size) -
	      sizeof(h) - meta_len;
	if (!err && pad) {
		char *scratch = uw_alloc(pad);

		err = scratch ? get(fd, scratch, pad, -1) : -ENOMEM;
		if (scratch)
			uw_free(scratch, pad);
	}
	for (uint32_t i = 0; !err && i < h.nregions; i++) {
		char *to = dst ? dst[i].addr : (char *)(uintptr_t)rg[2 * i];

		err = load_region(fd, &h, map, first, rg[2 * i + 1], to);
		first += rg[2 * i + 1] / h.page_size;
	}
	uw_free(meta, meta_len);
	if (!err && info)
		fill_info(&h, info);
	return err;
}
