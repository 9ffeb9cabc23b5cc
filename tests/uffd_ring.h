/* SPDX-License-Identifier: GPL-2.0 */
/*
 * uffd_ring.h: the write-log ring uAPI (kernel/patches: UFFD_FEATURE_WP_RING,
 * UFFDIO_RING_SETUP, UFFDIO_RING_RESET) and small helpers for the guest
 * programs that use it.  The definitions are repeated here under #ifndef so
 * that the programs also build against a tree without the ring (the base
 * and mutant lanes), where they report the feature as missing.
 */
#ifndef UFFDWP_TESTS_UFFD_RING_H
#define UFFDWP_TESTS_UFFD_RING_H

#include <linux/userfaultfd.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef UFFD_FEATURE_WP_RING
#define UFFD_FEATURE_WP_RING		(1 << 30)
#define _UFFDIO_RING_SETUP		(0x30)
#define _UFFDIO_RING_RESET		(0x31)
#define UFFD_RING_MIN_ENTRIES		64
#define UFFD_RING_MAX_ENTRIES		(1 << 22)
struct uffdio_ring_setup {
	__u64 entries;
	__u64 flags;
	__u64 mmap_size;
};
struct uffd_ring_header {
	__u64 producer;
	__u64 __reserved[15];
	__u64 consumer;
	__u64 entries;
	__u64 flags;
	__u64 entry_offset;
	__u64 overflows;
};
#define UFFD_RING_OVERFLOW		((__u64)1 << 0)
#define UFFD_RING_ENTRY_HUGE		((__u64)1 << 0)
struct uffdio_ring_reset {
	__u64 consumer;
	__u64 flags;
	__u64 reprotected;
	__u64 overflows;
};
#define UFFDIO_RING_RESET_CLEAR_OVERFLOW	((__u64)1 << 0)
#define UFFDIO_RING_SETUP	_IOWR(UFFDIO, _UFFDIO_RING_SETUP, \
				      struct uffdio_ring_setup)
#define UFFDIO_RING_RESET	_IOWR(UFFDIO, _UFFDIO_RING_RESET, \
				      struct uffdio_ring_reset)
#endif
#ifndef UFFDIO_RING_RESET_DISCARD
#define UFFDIO_RING_RESET_DISCARD		((__u64)1 << 1)
#endif
#ifndef UFFDIO_SET_MODE
#define _UFFDIO_SET_MODE			(0x32)
struct uffdio_set_mode {
	__u64 enable;
	__u64 disable;
};
#define UFFDIO_SET_MODE		_IOW(UFFDIO, _UFFDIO_SET_MODE, \
				     struct uffdio_set_mode)
#endif

/* A ring as seen from user space: the mapping and the consumer's place. */
struct uring_view {
	int uffd;
	struct uffd_ring_header *hdr;
	const uint64_t *slots;
	size_t map_size;
	uint64_t consumer;	/* next entry to read */
	/* the header's overflow count as ring_overflowed() last read it,
	 * before the flag: what ring_reset() passes with CLEAR_OVERFLOW */
	uint64_t overflows_seen;
};

/* True when this kernel's UFFDIO_API offers the ring. */
bool ring_supported(void);
/* True when this kernel's UFFDIO_API offers UFFDIO_SET_MODE. */
bool set_mode_supported(void);
/* UFFDIO_SET_MODE switching UFFD_FEATURE_WP_ASYNC on (ASYNC) or off. */
int uffd_set_async(int uffd, bool async);

/*
 * Open a userfaultfd with WP_ASYNC | WP_RING (| EXTRA features), set up a
 * ring of ENTRIES slots and map it.  Returns 0 or -errno (the step that
 * failed is not distinguished: tests that check one step do it by hand).
 */
int ring_open(struct uring_view *r, uint64_t entries, uint64_t extra);
void ring_close(struct uring_view *r);

/*
 * Map NPAGES of private anonymous memory, fill them first if POPULATE,
 * register them for WP on R's uffd and write-protect them.  The area or
 * NULL.
 */
char *ring_track(struct uring_view *r, size_t npages, bool populate);

/*
 * ring_open() with ENTRIES slots, then ring_track() of NPAGES populated
 * pages: the area, or NULL with NAME reported failed (TAP) and the ring
 * closed.
 */
char *ring_tracked(struct uring_view *r, const char *name, uint64_t entries,
		   size_t npages);

/* The producer index, read with acquire semantics. */
uint64_t ring_producer(const struct uring_view *r);
/* Whether the overflow flag is set; records the overflow count read before
 * it, which ring_reset() passes, so that a clear covers only an overflow
 * this caller has seen (the kernel says -ESTALE otherwise). */
bool ring_overflowed(struct uring_view *r);
/* The consumer index the kernel published (a reset's progress), acquire. */
uint64_t ring_consumer(const struct uring_view *r);
/* Entry number I (free running). */
uint64_t ring_entry(const struct uring_view *r, uint64_t i);

/* UFFDIO_RING_RESET up to CONSUMER; *reprotected if not NULL. 0 or -errno.
 * With CLEAR_OVERFLOW it passes the count of the last ring_overflowed(). */
int ring_reset(struct uring_view *r, uint64_t consumer, uint64_t flags,
	       uint64_t *reprotected);

/*
 * PAGEMAP_SCAN over [addr, addr + len): report every written page (the
 * async WP state says it was written since it was last protected) and
 * write-protect it again.  Calls FN for each written page.  Returns the
 * number of pages found or -errno.
 */
long scan_written_reprotect(void *addr, size_t len,
			    void (*fn)(unsigned long page, void *arg), void *arg);

#endif
