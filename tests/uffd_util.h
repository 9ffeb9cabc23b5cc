/* SPDX-License-Identifier: GPL-2.0 */
/*
 * uffd_util.h: thin wrappers over the userfaultfd uAPI and /proc/self/pagemap
 * for the guest test programs.  Every call returns 0 (or a count) on success
 * and -errno on failure, so a test can check the exact errno.
 */
#ifndef UFFDWP_TESTS_UFFD_UTIL_H
#define UFFDWP_TESTS_UFFD_UTIL_H

#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

/* /proc/pid/pagemap bits (Documentation/admin-guide/mm/pagemap.rst). */
#define PM_SOFT_DIRTY	(1ULL << 55)
#define PM_MMAP_EXCL	(1ULL << 56)
#define PM_UFFD_WP	(1ULL << 57)
#define PM_FILE		(1ULL << 61)
#define PM_SWAP		(1ULL << 62)
#define PM_PRESENT	(1ULL << 63)

#define HPAGE_SIZE	(2UL << 20)

/* Newer than some libc headers; the guest has no libnuma for numaif.h. */
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE	25
#endif
#ifndef MPOL_MF_MOVE
#define MPOL_MF_MOVE	(1 << 1)
#endif

long page_size(void);

/* Number of PMD-mapped 2 MiB blocks in [P, P + LEN), or -errno
 * (-EOPNOTSUPP when built without PAGEMAP_SCAN in the headers). */
long pmd_mapped_blocks(void *p, size_t len);

/* userfaultfd(flags) then UFFDIO_API asking for FEATURES; *got (if not NULL)
 * receives the features the kernel reports.  Returns the fd or -errno. */
int uffd_open_flags(int flags, uint64_t features, uint64_t *got);
int uffd_open(uint64_t features, uint64_t *got);
int uffd_register(int uffd, void *addr, size_t len, uint64_t mode,
		  uint64_t *ioctls);
int uffd_unregister(int uffd, void *addr, size_t len);
int uffd_wp(int uffd, void *addr, size_t len, uint64_t mode);
int uffd_copy(int uffd, void *dst, const void *src, size_t len, uint64_t mode);
int uffd_zeropage(int uffd, void *dst, size_t len, uint64_t mode);
/* UFFDIO_MOVE of LEN bytes, retried (up to 100 times, 1 ms apart) while the
 * kernel answers EAGAIN, as it does when a page is briefly pinned or its
 * folio is locked.  0 or -errno. */
int uffd_move(int uffd, void *dst, void *src, size_t len, uint64_t mode);
int uffd_wake(int uffd, void *addr, size_t len);
/* move_pages(2) on this process, the raw syscall (no libnuma). */
long sys_move_pages(unsigned long count, void **pages, const int *nodes,
		    int *status, int flags);
/* Wait up to TIMEOUT_MS for one message: 1 got one, 0 none, -errno. */
int uffd_read_msg(int uffd, struct uffd_msg *msg, int timeout_ms);

/* Write VAL to the sysctl or sysfs file PATH: 0 or -errno. */
int write_knob(const char *path, const char *val);
/* /sys/kernel/mm/ksm/NAME: write VAL (0 or -errno); read it (-1 when it
 * cannot be read). */
int ksm_set(const char *name, const char *val);
long ksm_get(const char *name);
/* The pagemap entry of ADDR in this process, or 0 with errno set. */
uint64_t pagemap_entry(void *addr);
/* The same through a descriptor of its own, opened and closed here: for a
 * forked child, or a signal handler (async-signal-safe). */
uint64_t pagemap_entry_fresh(void *addr);
bool page_wp(void *addr);
/* Pages in [addr, addr + len) whose pagemap entry has every bit of MASK. */
size_t pages_with(void *addr, size_t len, uint64_t mask);
/* Pages in [addr, addr + len) whose pagemap entry has every bit of SET and
 * none of CLEAR. */
size_t pages_matching(void *addr, size_t len, uint64_t set, uint64_t clear);
/* True if pagemap entry E is a swap entry of a real slot on swap device 0
 * (the guest's zram): not present, type 0 and a non-zero offset, so not a
 * pte marker. */
bool pm_swapped(uint64_t e);
/* Pages in [addr, addr + len) that are pm_swapped() with every bit of MASK. */
size_t pages_swapped(void *addr, size_t len, uint64_t mask);
/* MADV_PAGEOUT [addr, addr + len) until every page is pages_swapped() with
 * MASK, up to 20 tries 10 ms apart.  Returns 0, -errno if madvise() fails,
 * or -EAGAIN if some pages never reached swap.  Pages faulted in on another
 * CPU can sit in its LRU batch: call pin_to_cpu0() first. */
int page_out(void *addr, size_t len, uint64_t mask);
/* AnonHugePages (kB) of the mapping that contains ADDR, or -1. */
long smaps_field_kb(void *addr, const char *field);

/* mmap LEN bytes of private anonymous memory aligned to ALIGN. */
void *map_anon_aligned(size_t len, size_t align);

/* A thread that stores VAL into every page of [addr, addr + len). */
struct writer {
	pthread_t thread;
	char *addr;
	size_t len;
	char val;
	volatile int done;
};
int writer_start(struct writer *w, void *addr, size_t len, char val);
/* Wait up to TIMEOUT_MS for the writer to finish; true if it did. */
bool writer_wait(struct writer *w, int timeout_ms);
/* writer_wait() for a writer that may never have been started: a zeroed
 * W, or one already joined here, has addr NULL and counts as finished.
 * A joined writer's addr is set to NULL, so W->addr tells whether a writer
 * is still to be waited for (and released) on a failure path. */
bool writer_joined(struct writer *w, int timeout_ms);

/* A thread that resolves every WP fault on UFFD by unprotecting the page
 * (mode 0, waking the writer) and counts what it saw. */
struct resolver {
	pthread_t thread;
	int uffd;
	volatile int stop;
	volatile int faults;		/* WP page faults resolved */
	volatile int other;		/* any other message */
	volatile int errors;		/* failed ioctls */
	volatile uint64_t last_flags;
	volatile unsigned long last_addr;
};
int resolver_start(struct resolver *r, int uffd);
void resolver_stop(struct resolver *r);

/* Fill P with a pseudo-random pattern derived from SEED (xorshift). */
void fill_pattern(char *p, size_t len, unsigned int seed);
/* Offset of the first byte where A and B differ, or -1. */
long first_diff(const char *a, const char *b, size_t len);
/* Run the calling thread on CPU 0 only: 0 or -errno.  MADV_PAGEOUT and
 * move_pages() see every page once the LRU batches of one CPU drain. */
int pin_to_cpu0(void);

/*
 * The shapes the conformance suites share.  A check returns
 * because("...") (printf-like: the reason goes to WHY, the call returns
 * false), and the case reports tap_check(ok, name, "%s", why).
 */
extern char why[512];
bool because(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Put PREFIX before the reason already in WHY; returns false. */
bool because_with(const char *prefix);
/* In a case with a WHY buffer (its own or the one above) and an "out:"
 * label: record the reason and go there. */
#define FAIL(...)						\
	do {							\
		snprintf(why, sizeof(why), __VA_ARGS__);	\
		goto out;					\
	} while (0)
/* "PAGEFAULT", "FORK", "REMAP", "REMOVE", "UNMAP" or "unknown". */
const char *uffd_event_name(unsigned int event);
/* One message within TIMEOUT_MS, and it is a PAGEFAULT at ADDR with exactly
 * FLAGS; else because() says what came instead. */
bool expect_fault(int uffd, const void *addr, uint64_t flags, int timeout_ms);
/* No message within QUIET_MS; else because(), naming WHEN ("" for none). */
bool expect_quiet(int uffd, int quiet_ms, const char *when);
/* Write-protect [P, P + LEN) and check that pagemap shows every page of it
 * PM_UFFD_WP; else because(). */
bool protect_checked(int uffd, void *p, size_t len);
/*
 * Let writer W, which may be blocked in a fault on [P, P + LEN), go:
 * unprotect the range (mode 0 wakes), wake it, and wait TIMEOUT_MS.  If it
 * still has not finished, *STUCK is set (the range must never be unmapped
 * under it) and a diagnostic says so.
 */
void writer_release_wake(struct writer *w, int uffd, void *p, size_t len,
			 int timeout_ms, bool *stuck);

/*
 * Wait up to TIMEOUT_MS for *DONE to become non-zero (a thread's last
 * store, with release order); true if it did.  The caller joins.
 */
bool done_within(volatile int *done, int timeout_ms);
/* done_within(), then join THREAD; false (not joined) if it timed out. */
bool joined_within(pthread_t thread, volatile int *done, int timeout_ms);

/*
 * The area most conformance cases start from: NPAGES private anonymous
 * pages at BASE, each filled with PATTERN(page, offset), or left
 * unpopulated with the pattern in a separate source buffer SRC (for the
 * cases that copy pages in), and the case's uffd over it (-1 until the
 * case opens one).
 */
struct pat_area {
	int uffd;
	char *base;
	char *src;
	size_t len;
	int npages;
	bool stuck;		/* a thread may still touch it: never unmap */
	char (*pattern)(int i, size_t off);
};
/* Map and fill the area (the source instead with WITH_SRC); else because(). */
bool pat_area_map(struct pat_area *a, int npages, char (*pattern)(int, size_t),
		  bool with_src);
char *pat_area_page(struct pat_area *a, int i);
/* Close the uffd and unmap (the area itself not if it is stuck). */
void pat_area_teardown(struct pat_area *a);
/* Page I holds the pattern, with byte 0 replaced by VAL if WRITTEN; else because(). */
bool pat_area_holds(struct pat_area *a, int i, bool written, char val);

/* Kill the process with a failure line if it runs longer than SECONDS. */
void watchdog(int seconds);
/* Milliseconds of CLOCK_MONOTONIC. */
long long now_ms(void);

#endif
