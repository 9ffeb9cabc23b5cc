/* SPDX-License-Identifier: LGPL-2.1-or-later OR MIT */
/*
 * internal.h: what the files of libuffdwp share and do not export.
 * Every helper returns 0 (or a count) or -errno, like the public API.
 */
#ifndef UFFDWP_INTERNAL_H
#define UFFDWP_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uffdwp.h"
#include "uapi_compat.h"

#define UW_HPAGE_SIZE	(2UL << 20)

size_t uw_page_size(void);
/* uffdwp_probe() that also says whether the answer is only for now: 0,
 * or the -errno (-EMFILE, -ENFILE, -ENOMEM...) that kept a step of the
 * probe from telling; such an answer is not cached. */
int uw_probe(struct uffdwp_features *f);
uint64_t uw_now_ns(void);
/* ioctl retried on EINTR: 0 or -errno.  -EAGAIN (a userfaultfd event is
 * pending: mmap_changing) is returned; snapshot.c reads the events and
 * retries (uw_snap_wp()). */
int uw_ioctl(int fd, unsigned long req, void *arg);
/* Anonymous private memory from mmap (never inside a tracked region):
 * NULL on failure.  uw_free() takes the length uw_alloc() was given. */
void *uw_alloc(size_t len);
void uw_free(void *p, size_t len);

/* A validated, address-sorted copy of the caller's regions with a page
 * index over all of them. */
struct uw_regions {
	size_t nr;
	struct uffdwp_region *r;	/* sorted by address */
	size_t *first;			/* page index of r[i]'s first page */
	size_t pages;			/* total */
	size_t alloc_len;
};
int uw_regions_init(struct uw_regions *rs, const struct uffdwp_region *r,
		    size_t nr);
void uw_regions_fini(struct uw_regions *rs);
/* Page index of ADDR, or -1 if outside every region. */
long uw_page_index(const struct uw_regions *rs, uintptr_t addr);
uintptr_t uw_page_addr(const struct uw_regions *rs, size_t idx);

/* userfaultfd helpers. */
int uw_register_wp(int uffd, const struct uw_regions *rs);
void uw_unregister(int uffd, const struct uw_regions *rs);
int uw_protect(int uffd, uintptr_t addr, size_t len, bool wp, bool wake);
/* MADV_POPULATE_READ (or touch) every page of the regions so that WP
 * without WP_UNPOPULATED covers them. */
int uw_populate_read(const struct uw_regions *rs);
int uw_populate_range(uintptr_t addr, size_t len);
/* PAGEMAP_SCAN (on PAGEMAP_FD, with FLAGS, reporting pages in every
 * category of MASK) over every region, VEC of VEC_LEN entries at a time;
 * FN gets each reported range [start, end).  0 or -errno. */
int uw_scan_regions(int pagemap_fd, const struct uw_regions *rs,
		    uint64_t flags, uint64_t mask, struct page_region *vec,
		    size_t vec_len,
		    void (*fn)(void *arg, uintptr_t start, uintptr_t end),
		    void *arg);

/* Wake the threads waiting on faults in [addr, addr + len). */
int uw_wake(int uffd, uintptr_t addr, size_t len);

/* Snapshot files (snapfile.c; the layout is in docs/libuffdwp.md). */
#define UW_FILE_MAGIC	"UFFDWPSN"
#define UW_FILE_VERSION	2	/* written; 1 (no checksums) still read */
#define UW_FILE_VERSION_FLAGS 3	/* 2 with header flags: written only
				 * when FLAGS is not 0 */
#define UW_FILE_CK_MAGIC "UFFDWPCK"
struct uw_file_header {
	char magic[8];
	uint32_t version;
	uint32_t header_len;		/* sizeof(struct uw_file_header) */
	uint32_t page_size;
	uint32_t kind;			/* UFFDWP_FILE_* */
	uint32_t nregions;
	uint32_t flags;			/* UFFDWP_FILE_* flags (version 3) */
	uint64_t session;
	uint64_t epoch;
	uint64_t pages_total;
	uint64_t pages;
};
/* Bytes before the first stored page: header, regions, bitmap, padding
 * to a page. */
size_t uw_file_data_off(size_t nregions, size_t pages_total, size_t psz);
/* The checksums (version 2): a record's, seeded with its position K
 * (the prefix is record 0, stored page k record k + 1); LEN a multiple
 * of 8.  A change confined to one 8-byte word always changes it. */
uint64_t uw_file_sum(uint64_t k, const void *p, size_t len);
/* Bytes after the stored pages: their sums, the sums' sum, the magic. */
static inline size_t uw_file_trailer_len(uint64_t pages)
{
	return (size_t)pages * 8 + 16;
}
/* Fill BUF (uw_file_trailer_len() bytes) from the stored pages' SUMS. */
void uw_file_trailer(char *buf, const uint64_t *sums, uint64_t pages);
/* Fill BUF (uw_file_data_off() bytes) for a file of RS storing the pages
 * set in MAP (PAGES of them; every page when MAP is NULL). */
void uw_file_prefix(char *buf, const struct uw_regions *rs,
		    const _Atomic uint64_t *map, uint32_t kind, uint32_t flags,
		    uint64_t session, uint64_t epoch, uint64_t pages);

/* Soft-dirty: one user per process. */
int uw_soft_dirty_claim(void);
void uw_soft_dirty_release(void);
bool uw_soft_dirty_in_use(void);
int uw_clear_refs_soft_dirty(void);

/* Atomic bitmap. */
static inline void uw_bit_set(_Atomic uint64_t *map, size_t i)
{
	atomic_fetch_or_explicit(&map[i / 64], 1ULL << (i % 64),
				 memory_order_relaxed);
}

static inline bool uw_bit_test(const _Atomic uint64_t *map, size_t i)
{
	return atomic_load_explicit(&map[i / 64], memory_order_relaxed) >>
	       (i % 64) & 1;
}

/* The first set bit of MAP in [FROM, END), or END. */
static inline size_t uw_bit_next(const _Atomic uint64_t *map, size_t from,
				 size_t end, bool set)
{
	while (from < end) {
		uint64_t w = atomic_load_explicit(&map[from / 64],
						  memory_order_relaxed);

		w = (set ? w : ~w) >> (from % 64);
		if (w) {
			from += (size_t)__builtin_ctzll(w);
			return from < end ? from : end;
		}
		from = (from / 64 + 1) * 64;
	}
	return end;
}

/* The next run of set bits of MAP in [*FROM, END): true and [*START,
 * *FROM) (*FROM moved past it), or false when there is none. */
static inline bool uw_bit_run(const _Atomic uint64_t *map, size_t *from,
			      size_t end, size_t *start)
{
	*start = uw_bit_next(map, *from, end, true);
	if (*start == end)
		return false;
	*from = uw_bit_next(map, *start, end, false);
	return true;
}

/* Trackers: each backend provides these operations. */
struct uffdwp_tracker;
struct uw_tracker_ops {
	int (*start)(struct uffdwp_tracker *t);
	/* OR every page written since the last gather into t->pending. */
	int (*gather)(struct uffdwp_tracker *t);
	void (*stop)(struct uffdwp_tracker *t);
};

struct uffdwp_tracker {
	uint32_t magic;			/* UW_TRACKER_MAGIC while alive */
	pid_t owner;			/* the creating process: in a child of
					 * fork() the tracker is inert */
	enum uffdwp_backend backend;
	const struct uw_tracker_ops *ops;
	struct uw_regions rs;
	_Atomic uint64_t *pending;	/* one bit per page, to report */
	bool round_full;		/* the last collect handed out the
					 * round's last pages, MAX of them */
	size_t words;
	/* backend state */
	int uffd;
	bool registered;		/* uffd registered the regions */
	int pagemap_fd;
	void *ring;			/* ring mapping */
	size_t ring_len;
	uint64_t ring_consumer;
	bool ring_no_discard;		/* kernel lacks UFFDIO_RING_RESET_DISCARD */
	struct page_region *vec;	/* PAGEMAP_SCAN output */
	size_t vec_len;
	_Atomic uint64_t *faulted;	/* mprotect: set by SIGSEGV handler */
	int *prot;			/* mprotect: each region's protection */
	int slot;			/* mprotect: handler table slot */
	/* mprotect and soft-dirty: a region whose protection the program
	 * changed (tracker_mprotect.c): untouched from then on, every page
	 * reported by every collect; TOLD: -ESTALE returned for it. */
	_Atomic bool *stale;
	bool *stale_told;
	size_t stale_len;
	/* mprotect: claims in flight by epoch parity, and the pages a
	 * gather makes read-only again */
	atomic_uint claim_epoch;
	atomic_int claiming[2];
	_Atomic uint64_t *rearm;
	/* mprotect: odd from a gather's last take of the bits until its
	 * pages are read-only again (a claim overlapping it redoes its
	 * unprotect, tracker_mprotect.c) */
	atomic_uint protect_seq;
	/* mprotect and soft-dirty (tracker_mprotect.c, tracker.c) */
	atomic_int hold;		/* soft-dirty: writers wait in the handler */
	_Atomic uint64_t *mapped;	/* page not none at the last pagemap pass */
	_Atomic uint64_t *own;		/* page present exclusive or swapped then */
	uint64_t *pfn;			/* its frame then, if pagemap shows it */
};

/*
 * Handles the caller passes to the functions of 0.4 (handle.c): a live
 * one starts with its kind's magic, cleared before it is freed, so a
 * freed (unmapped) or garbage pointer is -EINVAL where it can be read
 * without a fault.  uw_copy_out: LEN bytes from SRC to the caller's DST
 * without a fault (0, or -EINVAL when DST is not writable).
 */
#define UW_TRACKER_MAGIC	0x54575755u	/* "UWWT" */
#define UW_SNAPSHOT_MAGIC	0x53575755u	/* "UWWS" */
#define UW_SESSION_MAGIC	0x45575755u	/* "UWWE" */
bool uw_handle_live(const void *h, uint32_t magic);
int uw_copy_out(void *dst, const void *src, size_t len);

/* Test seam: ring trackers created while it is set act as on a kernel
 * without UFFDIO_RING_RESET_DISCARD (tests/lib-tracker.c). */
extern bool uw_ring_no_discard;
/* Test seam: when set, a snapshot's copier calls it before each chunk
 * (tests/lib-snapshot.c holds the copier there to get writers ahead). */
extern void (*uw_snap_before_chunk)(void);
/* Measurement seam (precopy.c): the last pre-copy instant's switch to sync
 * mode and ring harvest, ns. */
extern uint64_t uw_precopy_switch_ns, uw_precopy_harvest_ns;
/* Test seam: called after each pre-copy round's writes (precopy.c). */
extern void (*uw_precopy_after_round)(uint64_t round);
extern const struct uw_tracker_ops uw_ring_ops, uw_scan_ops, uw_softdirty_ops,
	uw_mprotect_ops;

/* The SIGSEGV handler of the mprotect backend, shared with soft-dirty
 * (tracker_mprotect.c).  Attach: refuse regions another attached tracker
 * covers (-EBUSY) or that are not writable with one protection throughout
 * (-EINVAL), record their protections, enter the handler's table and (if
 * PROTECT) take PROT_WRITE away.  Detach: give the protections back, leave
 * the table, wait for handlers using T.  Hold/release: regions read-only
 * and writers waiting in the handler in between (soft-dirty's read and
 * clear). */
int uw_segv_attach(struct uffdwp_tracker *t, bool protect);
/* Whether T's regions overlap those of a tracker in the table. */
bool uw_segv_overlaps(const struct uffdwp_tracker *t);
/* In a child of fork(): T out of the (child's) table and its regions'
 * protections back in the child's memory, without a lock or a wait. */
void uw_segv_forget(struct uffdwp_tracker *t);
void uw_segv_detach(struct uffdwp_tracker *t, bool restore);
/* At the start of a gather: the regions' mappings against what T set; a
 * region the program changed is stale (never touched again, every page
 * pending in every round); -ESTALE the first time one is, else 0. */
int uw_segv_check(struct uffdwp_tracker *t);
int uw_segv_hold(struct uffdwp_tracker *t);
int uw_segv_release(struct uffdwp_tracker *t);
/* In a child of fork() (tracker.c); whether a bit of MAP is set. */
bool uw_tracker_foreign(const struct uffdwp_tracker *t);
bool uw_bits_any(_Atomic uint64_t *map, size_t words);
/* A collect call's round (tracker.c), for collect and collect_ranges:
 * _start is 1 when there are pending pages to hand out (gathered now if
 * the last round's were all handed out), 0 when this call ends a round
 * whose last call filled MAX (it returns 0), or the gather's -errno;
 * _end, after N of MAX were handed out, notes whether that filled the
 * round. */
int uw_tracker_round_start(struct uffdwp_tracker *t);
void uw_tracker_round_end(struct uffdwp_tracker *t, size_t n, size_t max);
/* Pagemap passes (tracker.c): open /proc/self/pagemap and the state
 * bitmaps; one pass reads every region's entries, marks pending the pages
 * whose content the program discarded since the last pass (and, if
 * SOFT_DIRTY, the soft-dirty ones) unless FIRST; close. */
int uw_pagemap_open(struct uffdwp_tracker *t);
int uw_pagemap_pass(struct uffdwp_tracker *t, bool soft_dirty, bool first);
void uw_pagemap_close(struct uffdwp_tracker *t);

/* PAGEMAP_SCAN over every region: pages written (PAGE_IS_WRITTEN) are set
 * in t->pending and protected again.  Shared by the scan and ring
 * backends. */
int uw_scan_written(struct uffdwp_tracker *t);
/* Open a WP_ASYNC userfaultfd (EXTRA: more features), run SETUP (if any)
 * before registering, register and protect every region; and undo it. */
int uw_async_start(struct uffdwp_tracker *t, uint64_t extra,
		   int (*setup)(struct uffdwp_tracker *t));
void uw_async_stop(struct uffdwp_tracker *t);
/* Set the pending bits of [addr, addr + len) clipped to the regions. */
void uw_mark_range(struct uffdwp_tracker *t, uintptr_t addr, size_t len);
/* Set in MAP the bit of every page of RS in [ADDR, ADDR + LEN). */
void uw_mark_pages(const struct uw_regions *rs, _Atomic uint64_t *map,
		   uintptr_t addr, size_t len);
/* The write-log ring: set it up with ENTRIES slots on UFFD and map it
 * (*RING, *LEN), or -errno; mark in MAP the pages of its entries
 * [FROM, TO). */
int uw_ring_map(int uffd, uint64_t entries, void **ring, size_t *len);
void uw_ring_mark(const void *ring, uint64_t from, uint64_t to,
		  const struct uw_regions *rs, _Atomic uint64_t *map);

#endif
