// SPDX-License-Identifier: GPL-2.0
/*
 * conformance-migration: the uffd-wp bit survives page migration between
 * NUMA nodes (the guest has two).
 *
 * Contract (area 6): move_pages() of write-protected pages to the other
 * node keeps them protected -- PM_UFFD_WP in pagemap and a real WP fault on
 * the next write -- with their data intact, and the pages really moved
 * (move_pages() status, and a query with nodes == NULL afterwards).
 * Covered for small anonymous pages, a PMD-mapped anonymous THP (PMD
 * migration entry), shmem pages and a hugetlb page.
 *
 * There is no libnuma in the guest: sys_move_pages() is the raw syscall.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"
#include "wp_probe.h"

#ifndef MFD_HUGETLB
#define MFD_HUGETLB	0x0004U
#endif

#define NR_PAGES	8
#define NR_SUBPAGES	512
#define NODE_SYSFS	"/sys/devices/system/node/"
#define FREE_HUGE	"/hugepages/hugepages-2048kB/free_hugepages"

static long psz;

enum kind { ANON, ANON_THP, SHMEM, HUGETLB };

/* A protected test area of one kind, its expected data and its uffd. */
struct area {
	enum kind kind;
	char *p;
	size_t len;
	size_t step;		/* bytes per migrated unit (page or huge page) */
	char *expect;
	int uffd;
	bool leak;
};

static bool node_online(int node)
{
	char path[64];

	snprintf(path, sizeof(path), NODE_SYSFS "node%d", node);
	return access(path, F_OK) == 0;
}

static long free_hugepages(int node)
{
	char path[128], buf[32] = "";
	int fd;
	ssize_t n;

	snprintf(path, sizeof(path), NODE_SYSFS "node%d" FREE_HUGE, node);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? strtol(buf, NULL, 10) : -1;
}

/*
 * Keep the program on CPU 0 so that every page of an area is allocated on
 * that CPU's node and an area starts out on a single node.
 */
static long huge_kb(void *addr)
{
	return smaps_field_kb(addr, "AnonHugePages");
}

/* Map and populate an area of KIND; false with WHY on failure. */
static bool area_map(struct area *a, enum kind kind, char *why, size_t wlen)
{
	int fd = -1;

	memset(a, 0, sizeof(*a));
	a->kind = kind;
	a->uffd = -1;
	a->step = psz;
	a->len = NR_PAGES * psz;
	switch (kind) {
	case ANON:
		a->p = mmap(NULL, a->len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		break;
	case ANON_THP:
		a->len = a->step = HPAGE_SIZE;
		a->p = map_anon_aligned(HPAGE_SIZE, HPAGE_SIZE);
		if (!a->p)
			a->p = MAP_FAILED;
		else if (madvise(a->p, HPAGE_SIZE, MADV_HUGEPAGE))
			tap_diag("MADV_HUGEPAGE: %s", strerror(errno));
		break;
	case SHMEM:
	case HUGETLB:
		if (kind == HUGETLB)
			a->len = a->step = HPAGE_SIZE;
		fd = memfd_create("uffd-wp-migration",
				  kind == HUGETLB ? MFD_HUGETLB : 0);
		if (fd < 0 || ftruncate(fd, a->len)) {
			snprintf(why, wlen, "memfd: %s", strerror(errno));
			if (fd >= 0)
				close(fd);
			return false;
		}
		a->p = mmap(NULL, a->len, PROT_READ | PROT_WRITE, MAP_SHARED,
			    fd, 0);
		close(fd);
		break;
	}
	if (a->p == MAP_FAILED) {
		a->p = NULL;
		snprintf(why, wlen, "mmap: %s", strerror(errno));
		return false;
	}
	a->expect = malloc(a->len);
	if (!a->expect) {
		snprintf(why, wlen, "malloc failed");
		return false;
	}
	fill_pattern(a->p, a->len, kind + 1);
	memcpy(a->expect, a->p, a->len);
	return true;
}

/* Open a uffd with the features KIND needs, register A and protect it. */
static bool area_protect(struct area *a, char *why, size_t wlen)
{
	uint64_t features = UFFD_FEATURE_PAGEFAULT_FLAG_WP;

	if (a->kind == SHMEM || a->kind == HUGETLB)
		features |= UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
	a->uffd = wp_uffd_open(a->p, a->len, features, UFFDIO_REGISTER_MODE_WP,
			       true, why, wlen);
	return a->uffd >= 0;
}

static void area_destroy(struct area *a)
{
	if (a->uffd >= 0)
		close(a->uffd);
	free(a->expect);
	if (a->p && !a->leak)
		munmap(a->p, a->len);
}

/* Units of the area: every page, or the head of the huge page. */
static int area_units(struct area *a, void **pages)
{
	int n = a->len / a->step;

	for (int i = 0; i < n; i++)
		pages[i] = a->p + i * a->step;
	return n;
}

/*
 * The node of every page of A (queried with nodes == NULL); -1 if they are
 * not all on one node.  WHY explains a failed query.
 */
static int area_node(struct area *a, char *why, size_t wlen)
{
	void *pages[NR_SUBPAGES];
	int status[NR_SUBPAGES], n = a->len / psz;

	for (int i = 0; i < n; i++) {
		pages[i] = a->p + i * psz;
		status[i] = -12345;
	}
	if (sys_move_pages(n, pages, NULL, status, 0)) {
		snprintf(why, wlen, "move_pages query: %s", strerror(errno));
		return -1;
	}
	for (int i = 1; i < n; i++) {
		if (status[i] != status[0]) {
			snprintf(why, wlen, "page %d on node %d, page 0 on node %d",
				 i, status[i], status[0]);
			return -1;
		}
	}
	if (status[0] < 0)
		snprintf(why, wlen, "query status %d", status[0]);
	return status[0];
}

/* Move every unit of A to NODE; check the status move_pages returns. */
static bool area_move(struct area *a, int node, char *why, size_t wlen)
{
	void *pages[NR_PAGES];
	int nodes[NR_PAGES], status[NR_PAGES];
	int n = area_units(a, pages);
	long ret;

	for (int i = 0; i < n; i++) {
		nodes[i] = node;
		status[i] = -12345;
	}
	ret = sys_move_pages(n, pages, nodes, status, MPOL_MF_MOVE);
	if (ret) {
		snprintf(why, wlen, "move_pages to node %d: %ld (%s)", node, ret,
			 ret < 0 ? strerror(errno) : "pages not migrated");
		return false;
	}
	for (int i = 0; i < n; i++) {
		if (status[i] != node) {
			snprintf(why, wlen, "move_pages status[%d] = %d, want node %d",
				 i, status[i], node);
			return false;
		}
	}
	return true;
}

/*
 * Write VAL at byte OFF of A through a WP fault.  The message names the
 * page (for hugetlb: the huge page, as UFFD_FEATURE_EXACT_ADDRESS is off);
 * the fault is resolved by unprotecting that unit.
 */
static bool fault_at(struct area *a, size_t off, char val, char *why,
		     size_t wlen)
{
	size_t unit = a->kind == HUGETLB ? HPAGE_SIZE : (size_t)psz;
	char *want = a->p + off / unit * unit;

	a->expect[off] = val;
	return wp_write_faults_once(a->uffd, a->p + off, val, want, want, unit,
				    &a->leak, why, wlen);
}

static bool data_ok(struct area *a, char *why, size_t wlen)
{
	long d = first_diff(a->p, a->expect, a->len);

	if (d < 0)
		return true;
	snprintf(why, wlen, "data differs at offset %ld", d);
	return false;
}

static bool all_wp(struct area *a, char *why, size_t wlen)
{
	size_t n = pages_with(a->p, a->len, PM_PRESENT | PM_UFFD_WP);

	if (n == a->len / psz)
		return true;
	snprintf(why, wlen, "%zu of %zu pages present with PM_UFFD_WP", n,
		 a->len / psz);
	return false;
}

/*
 * Set up an area of KIND, protect it and move it to the other node, then
 * check the move: the status, a fresh query, the WP bits and the data.
 * Reports fail/skip itself when the setup cannot work and returns false;
 * otherwise returns true with *OK telling whether the checks passed.
 */
static bool protected_and_moved(struct area *a, enum kind kind,
				const char *name, bool *ok, char *why,
				size_t wlen)
{
	int from, to, now;

	*ok = false;
	if (!area_map(a, kind, why, wlen)) {
		if (kind == HUGETLB)
			tap_skip(name, "no hugetlb page: %s", why);
		else
			tap_fail(name, "%s", why);
		return false;
	}
	if (kind == ANON_THP && huge_kb(a->p) != (long)(HPAGE_SIZE >> 10)) {
		tap_skip(name, "no THP: AnonHugePages %ld kB", huge_kb(a->p));
		return false;
	}
	if (!area_protect(a, why, wlen))
		return true;
	from = area_node(a, why, wlen);
	if (from < 0)
		return true;
	to = !from;
	if (kind == HUGETLB && free_hugepages(to) < 1) {
		tap_skip(name, "no free 2 MiB huge page on node %d", to);
		return false;
	}
	if (!area_move(a, to, why, wlen))
		return true;
	now = area_node(a, why, wlen);
	if (now != to) {
		if (now >= 0)
			snprintf(why, wlen, "query after the move: node %d, want %d",
				 now, to);
		return true;
	}
	if (kind == ANON_THP && huge_kb(a->p) != (long)(HPAGE_SIZE >> 10)) {
		snprintf(why, wlen, "THP split by the move: AnonHugePages %ld kB",
			 huge_kb(a->p));
		return true;
	}
	*ok = all_wp(a, why, wlen) && data_ok(a, why, wlen);
	return true;
}

/*
 * migration-pages-keep-wp: protected anonymous pages moved to the other
 * node are on that node, still PM_UFFD_WP, and hold their data.
 */
static void test_pages_keep_wp(void)
{
	const char *name = "migration-pages-keep-wp";
	char why[512] = "";
	struct area a;
	bool ok;

	if (protected_and_moved(&a, ANON, name, &ok, why, sizeof(why)))
		tap_check(ok, name, "%s", why);
	area_destroy(&a);
}

/*
 * migration-write-faults-after: after the move, a write to a protected
 * page takes exactly one WP fault; resolving it lets the write through and
 * leaves the other pages protected.
 */
static void test_write_faults_after(void)
{
	const char *name = "migration-write-faults-after";
	char why[512] = "";
	struct area a;
	bool ok;
	size_t n;

	if (!protected_and_moved(&a, ANON, name, &ok, why, sizeof(why)))
		goto out_free;
	if (!ok)
		goto out;
	ok = false;
	if (!fault_at(&a, 3 * psz + 17, 'm', why, sizeof(why)))
		goto out;
	n = pages_with(a.p, a.len, PM_UFFD_WP);
	if (n != NR_PAGES - 1)
		FAIL("%zu pages PM_UFFD_WP after resolving one, want %d", n,
		     NR_PAGES - 1);
	ok = data_ok(&a, why, sizeof(why));
out:
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

/*
 * migration-thp-keeps-wp: a protected PMD-mapped THP moved to the other
 * node stays PMD-mapped, protected on all 512 pages, with its data, and a
 * write takes a WP fault at the written page.
 */
static void test_thp_keeps_wp(void)
{
	const char *name = "migration-thp-keeps-wp";
	char why[512] = "";
	struct area a;
	bool ok;

	if (!protected_and_moved(&a, ANON_THP, name, &ok, why, sizeof(why)))
		goto out_free;
	if (ok)
		ok = fault_at(&a, 77 * psz, 't', why, sizeof(why)) &&
		     data_ok(&a, why, sizeof(why));
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

/*
 * migration-shmem-keeps-wp: protected shmem (memfd) pages moved to the
 * other node stay protected with their data; a write takes a WP fault.
 */
static void test_shmem_keeps_wp(void)
{
	const char *name = "migration-shmem-keeps-wp";
	char why[512] = "";
	struct area a;
	bool ok;

	if (!protected_and_moved(&a, SHMEM, name, &ok, why, sizeof(why)))
		goto out_free;
	if (ok)
		ok = fault_at(&a, 5 * psz, 's', why, sizeof(why)) &&
		     data_ok(&a, why, sizeof(why));
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

/*
 * migration-hugetlb-keeps-wp: a protected 2 MiB hugetlb page (memfd
 * MFD_HUGETLB) moved to the other node stays protected with its data; a
 * write takes a WP fault reported at the huge page's start.
 */
static void test_hugetlb_keeps_wp(void)
{
	const char *name = "migration-hugetlb-keeps-wp";
	char why[512] = "";
	struct area a;
	bool ok;

	if (!protected_and_moved(&a, HUGETLB, name, &ok, why, sizeof(why)))
		goto out_free;
	if (ok)
		ok = fault_at(&a, 300 * psz + 5, 'h', why, sizeof(why)) &&
		     data_ok(&a, why, sizeof(why));
	tap_check(ok, name, "%s", why);
out_free:
	area_destroy(&a);
}

int main(void)
{
	watchdog(60);
	psz = page_size();
	if (pin_to_cpu0())
		tap_diag("sched_setaffinity: %s", strerror(errno));
	tap_plan(5);
	if (!node_online(0) || !node_online(1)) {
		static const char *const names[] = {
			"migration-pages-keep-wp", "migration-write-faults-after",
			"migration-thp-keeps-wp", "migration-shmem-keeps-wp",
			"migration-hugetlb-keeps-wp",
		};

		for (int i = 0; i < 5; i++)
			tap_skip(names[i], "the guest has no second NUMA node");
		return tap_done();
	}
	test_pages_keep_wp();
	test_write_faults_after();
	test_thp_keeps_wp();
	test_shmem_keeps_wp();
	test_hugetlb_keeps_wp();
	return tap_done();
}
