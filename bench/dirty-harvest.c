// SPDX-License-Identifier: GPL-2.0
/*
 * dirty-harvest: what one round of dirty tracking costs when a fraction of
 * a large tracked region was written, with the write-log ring against what
 * users have today; and what the ring adds to an async write fault.
 *
 *   dirty-harvest  ring          read the ring's entries, UFFDIO_RING_RESET
 *                                (re-protect them in one call); when the
 *                                ring overflowed, discard its entries
 *                                (UFFDIO_RING_RESET_DISCARD), clear the
 *                                flag and do one PAGEMAP_SCAN round as the
 *                                fallback
 *                  ring_reprotect  (written_pct=100 only, its rounds
 *                                alternating with ring's in one context)
 *                                the same, but the overflowed round's reset
 *                                re-protects the entries before the scan,
 *                                as on a kernel without the discard flag
 *                  pagemap_scan  PAGEMAP_SCAN with PM_SCAN_WP_MATCHING over
 *                                the whole region (report written pages and
 *                                re-protect them)
 *                  soft_dirty    read /proc/self/pagemap for the region and
 *                                pick bit 55, then clear_refs 4
 *   param written_pct=<0.1|1|10|100>, metric round_us: harvest + re-protect,
 *   per round, into an array of page addresses (the writes are not timed).
 *   With --sweep-mib M,M... [--sweep-pages K,K...] (default 256,4096) it
 *   runs only these rounds, over a fresh region of each size with exactly K
 *   pages written per round, spread or clustered: param
 *   size_mib=M;written_pages=K;layout=spread|clustered (`make
 *   bench-sweep`; scripts/bench-report.py fits the cost against the size).
 *
 *   async-fault    ring, no_ring: time to write once to each protected page
 *                  of a region in async mode, per page (fault_ns).
 *
 * Every round checks that the harvested set holds every page written (and,
 * without overflow, nothing else), so a fast wrong answer fails the run.
 */
#define _GNU_SOURCE
#include "bench_util.h"
#include "uffd_ring.h"
#include "uffd_util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>


static long psz;
static uint64_t ring_entries;	/* a quarter of the region: 100% overflows */
static size_t npages;
static char *region;
static uint64_t *harvested;	/* page addresses found by one round */
static size_t nharvested;
static unsigned char *written;	/* 1 for each page written this round */
static unsigned char *found;

static void add_page(unsigned long page, void *arg)
{
	(void)arg;
	harvested[nharvested++] = page;
}

/* Write one byte to K pages (a different set each round): spread over the
 * region, or (clustered) K consecutive pages at a place that moves each
 * round; mark them in written[]. */
static bool clustered;

static void write_pages(size_t k, unsigned int round)
{
	size_t stride = npages / k, i;
	size_t start = npages > k ? (round * 7919UL * 64) % (npages - k) : 0;

	memset(written, 0, npages);
	for (i = 0; i < k; i++) {
		size_t pg = clustered ? start + i :
			    (i * stride + (round * 7919 + i * 31) % stride) %
			    npages;

		region[pg * psz + 64] = (char)(round + 1);
		written[pg] = 1;
	}
}

/* Compare the round's harvest with what was written. */
static void verify(const char *variant, const char *param, bool exact)
{
	size_t i, missing = 0, extra = 0;

	memset(found, 0, npages);
	for (i = 0; i < nharvested; i++) {
		unsigned long a = harvested[i] & ~(unsigned long)(psz - 1);

		if (a < (unsigned long)region ||
		    a >= (unsigned long)region + npages * psz) {
			extra++;
			continue;
		}
		found[(a - (unsigned long)region) / psz] = 1;
	}
	for (i = 0; i < npages; i++) {
		missing += written[i] && !found[i];
		extra += !written[i] && found[i];
	}
	if (missing || (exact && extra))
		bench_fail("%s %s: %zu written pages missing, %zu extra",
			   variant, param, missing, extra);
}

static int open_async(struct uring_view *r, bool ring)
{
	int err;

	if (ring) {
		err = ring_open(r, ring_entries, 0);
	} else {
		r->hdr = NULL;
		r->uffd = uffd_open(UFFD_FEATURE_WP_ASYNC, NULL);
		err = r->uffd < 0 ? r->uffd : 0;
	}
	if (err)
		return err;
	err = uffd_register(r->uffd, region, npages * psz,
			    UFFDIO_REGISTER_MODE_WP, NULL);
	if (!err)
		err = uffd_wp(r->uffd, region, npages * psz,
			      UFFDIO_WRITEPROTECT_MODE_WP);
	return err;
}

static void round_ring(struct uring_view *r, int *overflows, bool discard)
{
	uint64_t prod = ring_producer(r), i;
	bool over = ring_overflowed(r);
	uint64_t flags = 0;
	int err;

	nharvested = 0;
	if (over)
		flags = UFFDIO_RING_RESET_CLEAR_OVERFLOW |
			(discard ? UFFDIO_RING_RESET_DISCARD : 0);
	/* Discarded entries' pages stay writable: the scan finds them. */
	for (i = r->consumer; i < prod && !(flags & UFFDIO_RING_RESET_DISCARD);
	     i++)
		harvested[nharvested++] = ring_entry(r, i);
	err = ring_reset(r, prod, flags, NULL);
	if (err)
		bench_fail("UFFDIO_RING_RESET: %s", strerror(-err));
	if (over) {
		(*overflows)++;
		if (scan_written_reprotect(region, npages * psz, add_page,
					   NULL) < 0)
			bench_fail("PAGEMAP_SCAN fallback: %s", strerror(errno));
	}
}

static void round_scan(void)
{
	long n;

	nharvested = 0;
	n = scan_written_reprotect(region, npages * psz, add_page, NULL);
	if (n < 0)
		bench_fail("PAGEMAP_SCAN: %s", strerror((int)-n));
}

static int pagemap_fd = -1;
static uint64_t *pm_buf;

static int round_soft_dirty(void)
{
	size_t i, want = npages * sizeof(uint64_t), got = 0;
	off_t off = (off_t)((unsigned long)region / psz) * 8;
	int err;

	nharvested = 0;
	while (got < want) {
		ssize_t n = pread(pagemap_fd, (char *)pm_buf + got, want - got,
				  off + got);

		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		got += n;
	}
	for (i = 0; i < npages; i++)
		if (pm_buf[i] & PM_SOFT_DIRTY)
			harvested[nharvested++] =
				(unsigned long)region + i * psz;
	err = bench_write_file("/proc/self/clear_refs", "4");
	return err;
}

static bool soft_dirty_works(void)
{
	/* A page written after clear_refs 4 must show bit 55; on a kernel
	 * without CONFIG_MEM_SOFT_DIRTY the bit never appears. */
	if (bench_write_file("/proc/self/clear_refs", "4"))
		return false;
	region[0]++;
	return pagemap_entry(region) & PM_SOFT_DIRTY;
}

/* One figure's rounds: K pages written per round, labelled PARAM; BOTH:
 * the ring's rounds alternate discarding and re-protecting (overflow). */
struct round_set {
	size_t k;
	char param[64];
	bool both;
};

static void dirty_harvest(const struct bench_opts *o,
			  const struct round_set *sets, unsigned int nsets)
{
	static const char *const variants[] = { "ring", "pagemap_scan",
						"soft_dirty" };
	unsigned int v, p;
	int rep;

	for (v = 0; v < 3; v++) {
		struct uring_view r = { .uffd = -1 };
		bool ring = v == 0, sd = v == 2;
		int overflows = 0, err;

		if (sd) {
			if (!soft_dirty_works()) {
				bench_comment("soft_dirty skipped: bit 55 of /proc/self/pagemap never set (kernel without CONFIG_MEM_SOFT_DIRTY)");
				continue;
			}
			pagemap_fd = open("/proc/self/pagemap", O_RDONLY);
			if (pagemap_fd < 0)
				bench_fail("open pagemap: %s", strerror(errno));
			bench_write_file("/proc/self/clear_refs", "4");
		} else {
			err = open_async(&r, ring);
			if (err == -EINVAL && ring && !ring_supported()) {
				bench_comment("ring skipped: this kernel has no UFFD_FEATURE_WP_RING");
				continue;
			}
			if (err)
				bench_fail("%s setup: %s", variants[v],
					   strerror(-err));
		}
		for (p = 0; p < nsets; p++) {
			size_t k = sets[p].k;
			bool both = ring && sets[p].both;
			int rounds = both ? 2 * o->reps : o->reps;
			const char *param = sets[p].param;

			for (rep = 0; rep < rounds; rep++) {
				bool reprotect = both && rep % 2;
				const char *name = reprotect ? "ring_reprotect" :
							       variants[v];
				uint64_t t0;

				write_pages(k, rep + p * 100);
				t0 = bench_now_ns();
				if (ring)
					round_ring(&r, &overflows, !reprotect);
				else if (sd)
					err = round_soft_dirty();
				else
					round_scan();
				bench_sample("dirty-harvest", name, param,
					     "round_us",
					     (bench_now_ns() - t0) / 1e3, "us");
				if (sd && err)
					bench_fail("soft_dirty round: %s",
						   strerror(-err));
				verify(name, param, !sd && !overflows);
			}
			if (ring)
				bench_comment("ring %s: %d of %d rounds overflowed the %d-entry ring",
					      param, overflows, rounds,
					      (int)ring_entries);
			overflows = 0;
		}
		if (sd) {
			close(pagemap_fd);
		} else {
			uffd_unregister(r.uffd, region, npages * psz);
			if (ring)
				ring_close(&r);
			else
				close(r.uffd);
		}
	}
}

static void async_fault(const struct bench_opts *o, size_t pages)
{
	char param[32];
	int v, rep;

	snprintf(param, sizeof(param), "pages=%zu", pages);
	for (rep = 0; rep < o->reps; rep++) {
		/* Alternate the variants so drift hits both alike. */
		for (v = 0; v < 2; v++) {
			struct uring_view r = { .uffd = -1 };
			bool ring = v == 0;
			uint64_t t0, t1;
			size_t i;
			int err;

			err = open_async(&r, ring);
			if (err == -EINVAL && ring && !ring_supported())
				continue;
			if (err)
				bench_fail("async-fault setup: %s",
					   strerror(-err));
			t0 = bench_now_ns();
			for (i = 0; i < pages; i++)
				region[i * psz + 128] = (char)rep;
			t1 = bench_now_ns();
			bench_sample("async-fault", ring ? "ring" : "no_ring",
				     param, "fault_ns",
				     (double)(t1 - t0) / pages, "ns");
			if (ring && (ring_producer(&r) != pages ||
				     ring_overflowed(&r)))
				bench_fail("async-fault ring: %llu entries for %zu faults",
					   (unsigned long long)ring_producer(&r),
					   pages);
			uffd_unregister(r.uffd, region, npages * psz);
			if (ring)
				ring_close(&r);
			else
				close(r.uffd);
		}
	}
}

/* Map and populate the tracked region of PAGES 4 KiB pages and the
 * per-page arrays. */
static void map_region(size_t pages)
{
	npages = pages;
	region = mmap(NULL, npages * psz, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	harvested = malloc(npages * sizeof(*harvested));
	written = malloc(npages);
	found = malloc(npages);
	pm_buf = malloc(npages * sizeof(uint64_t));
	if (region == MAP_FAILED || !harvested || !written || !found || !pm_buf)
		bench_fail("allocating %zu pages: %s", npages, strerror(errno));
	/* 4 KiB pages throughout: async WP splits THPs on the first write
	 * anyway, and soft-dirty would see 2 MiB extents. */
	madvise(region, npages * psz, MADV_NOHUGEPAGE);
	memset(region, 1, npages * psz);
}

static void unmap_region(void)
{
	munmap(region, npages * psz);
	free(harvested);
	free(written);
	free(found);
	free(pm_buf);
}

/*
 * The sweep (--sweep-mib M,M... --sweep-pages K,K...): for each tracked
 * size, a fresh populated region and rounds that write exactly K pages, so
 * a round's cost can be split into what grows with the memory tracked and
 * what grows with the pages written.  The ring has 8192 entries at every
 * size (no round overflows it).  Two layouts of the written pages: spread
 * evenly over the region (at 4 GiB every page in its own page table) and
 * clustered (K consecutive pages), since re-protecting costs more per page
 * when every page sits in a different page table.
 */
static void sweep(const struct bench_opts *o, const char *mib_list,
		  const char *pages_list)
{
	size_t mibs[8], ks[4], nm, nk;
	struct round_set sets[4];
	int layout;

	nm = bench_parse_list("--sweep-mib", mib_list, mibs, 8, 4, 65536, 4);
	nk = bench_parse_list("--sweep-pages", pages_list ? pages_list : "256,4096",
			      ks, 4, 1, 8192, 1);
	ring_entries = 8192;
	bench_comment("dirty-harvest sweep: tracked size x pages written per round, a fresh populated region of 4 KiB pages per size, %d-entry ring, %d rounds per figure",
		      (int)ring_entries, o->reps);
	for (size_t m = 0; m < nm; m++) {
		uint64_t t0 = bench_now_ns();

		map_region((mibs[m] << 20) / psz);
		bench_comment("size %zu MiB populated in %.1f s", mibs[m],
			      (bench_now_ns() - t0) / 1e9);
		for (layout = 0; layout < 2; layout++) {
			clustered = layout;
			for (size_t k = 0; k < nk; k++) {
				if (ks[k] > npages)
					bench_fail("--sweep-pages %zu is more than the %zu pages of %zu MiB",
						   ks[k], npages, mibs[m]);
				sets[k].k = ks[k];
				sets[k].both = false;
				snprintf(sets[k].param, sizeof(sets[k].param),
					 "size_mib=%zu;written_pages=%zu;layout=%s",
					 mibs[m], ks[k],
					 clustered ? "clustered" : "spread");
			}
			dirty_harvest(o, sets, (unsigned int)nk);
		}
		unmap_region();
	}
}

int main(int argc, char **argv)
{
	static const double pcts[] = { 0.1, 1, 10, 100 };
	const char *mib_list = bench_take_opt(&argc, argv, "--sweep-mib");
	const char *pages_list = bench_take_opt(&argc, argv, "--sweep-pages");
	struct round_set sets[4];
	struct bench_opts o;
	size_t fault_pages;

	bench_parse_args(argc, argv, &o, 5);
	psz = page_size();
	if (pages_list && !mib_list)
		bench_fail("--sweep-pages needs --sweep-mib");
	if (mib_list) {
		sweep(&o, mib_list, pages_list);
		return 0;
	}
	map_region(o.quick ? 4096 : (1UL << 30) / psz);
	fault_pages = o.quick ? 1024 : 32768;
	ring_entries = npages / 4;
	bench_comment("tracked region %zu MiB (%zu pages), populated, 4 KiB pages; %d rounds per figure",
		      npages * psz >> 20, npages, o.reps);
	bench_comment("round_us = harvest + re-protect of one round into an array of page addresses; writes not timed");
	bench_comment("ring: %d entries, so 100%% written overflows and the round includes the PAGEMAP_SCAN fallback",
		      (int)ring_entries);
	for (unsigned int p = 0; p < 4; p++) {
		sets[p].k = (size_t)(npages * pcts[p] / 100);
		if (!sets[p].k)
			sets[p].k = 1;
		/* ring at 100%: discarding and re-protecting rounds
		 * alternate in the one context, side by side */
		sets[p].both = pcts[p] == 100;
		snprintf(sets[p].param, sizeof(sets[p].param),
			 "written_pct=%g", pcts[p]);
	}
	dirty_harvest(&o, sets, 4);
	bench_comment("async-fault: one write to each of %zu protected pages, fault_ns = wall time / pages",
		      fault_pages);
	async_fault(&o, fault_pages);
	return 0;
}
