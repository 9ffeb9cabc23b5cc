// SPDX-License-Identifier: GPL-2.0
/*
 * uffd.h: what the three parts of fuzz-uffd share; internal to the fuzzer.
 *   fuzz/uffd.c        the driver: arguments, replay (--seed, --ops), the
 *                      weighted draw of operations, the watchdog, the report;
 *   fuzz/uffd-model.c  the model: the PRNG, the pool of userfaultfds and
 *                      regions with word 0's shadow, the resolver and writer
 *                      threads, the range picker, the invariants' checks;
 *   fuzz/uffd-ops.c    the operations, one function per kind of call.
 */
#ifndef FUZZ_UFFD_H
#define FUZZ_UFFD_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_ring.h"
#include "uffd_util.h"

/* The ring uAPI comes from uffd_ring.h; entries keep flags below the page. */

#ifndef UFFD_RING_ENTRY_ADDR_MASK	/* ring-uapi.md names it; the header may not */
#define UFFD_RING_ENTRY_ADDR_MASK	(~0xfffULL)
#endif

#define NSLOTS		4	/* userfaultfds in the pool */
#define NREGIONS	6	/* anonymous regions */
#define NWRITERS	2
#define STALL_S		60	/* one operation longer than this: hung */
#define MAX_REPORTS	8	/* failure lines printed per family */
#define SRC_PAGES	16	/* UFFDIO_COPY source buffer */
#define CHILD_WAIT_MS	20000

/*
 * The errnos each operation may fail with: what build/linux (6.12 plus this
 * series) returns for it, on the fuzzer's memory (private anonymous only: no
 * hugetlb, shmem or file paths).  ESRCH (or ENOMEM) for mmget_not_zero() and
 * EINTR for a killable lock cannot reach a live process; they stay because
 * the operation returns them.  E() fails to compile for an errno >= 64.
 */
#define E(x)	((1ULL << (x)) + 0 * sizeof(char[(x) < 64 ? 1 : -1]))
/* userfaultfd(): EPERM from userfaultfd_syscall_allowed(), ENOMEM ctx/file */
#define ERR_UFFD_OPEN	(E(EINVAL) | E(EPERM) | E(ENOMEM))
/* EPERM: EVENT_FORK without CAP_SYS_PTRACE; a second call fails the cmpxchg */
#define ERR_API		(E(EFAULT) | E(EINVAL) | E(EPERM))
/* EBUSY: another ctx owns a VMA; ENOMEM: mmget_not_zero(), VMA split/merge */
#define ERR_REGISTER	(E(EFAULT) | E(EINVAL) | E(EBUSY) | E(ENOMEM))
/* ENOMEM as for REGISTER (userfaultfd_clear_vma()) */
#define ERR_UNREGISTER	(E(EFAULT) | E(EINVAL) | E(ENOMEM))
#define ERR_WAKE	(E(EFAULT) | E(EINVAL))
/*
 * mwriteprotect_range(): ENOENT for a range not all uffd-wp registered,
 * EAGAIN for ctx->mmap_changing, ENOMEM for change_protection()'s page
 * tables for markers (WP_UNPOPULATED).
 */
#define ERR_WRITEPROTECT (E(EFAULT) | E(EINVAL) | E(EAGAIN) | E(ENOENT) | \
			  E(ENOMEM) | E(ESRCH))
/*
 * COPY and ZEROPAGE (mfill_atomic()): ENOENT for no registered VMA around
 * dst, EEXIST for a populated pte or a huge pmd, EAGAIN for mmap_changing,
 * a vanished pte table or a partial fill, ENOMEM for anon_vma, page tables
 * or the page, EFAULT for an unreadable source.  EINTR only ever follows a
 * filled page, which makes it a partial fill (EAGAIN).
 */
#define ERR_MFILL	(E(EFAULT) | E(EINVAL) | E(EAGAIN) | E(ENOENT) | \
			 E(EEXIST) | E(ENOMEM) | E(ESRCH))
/* mfill_atomic() refuses an anonymous VMA (EINVAL) before any pte */
#define ERR_CONTINUE	(E(EFAULT) | E(EINVAL) | E(EAGAIN) | E(ENOENT) | \
			 E(ENOMEM) | E(ESRCH))
/* do_pagemap_scan(): EPERM for CHECK_WPASYNC on a VMA that is not async */
#define ERR_SCAN	(E(EFAULT) | E(EINVAL) | E(ENOMEM) | E(EINTR) | \
			 E(EPERM) | E(ESRCH))
/* EPERM: over vm.uffd_ring_max_entries; EBUSY: a ring already, or registered */
#define ERR_RING_SETUP	(E(EFAULT) | E(EINVAL) | E(EPERM) | E(EBUSY) | \
			 E(ENOMEM) | E(ESRCH))
/* uffd_wp_log_reprotect(): EAGAIN mmap_changing, ENOMEM change_protection() */
#define ERR_RING_RESET	(E(EFAULT) | E(EINVAL) | E(EAGAIN) | E(EINTR) | \
			 E(ENOMEM) | E(ESRCH))
/* do_mmap(): EACCES for PROT_WRITE on the O_RDONLY fd; userfaultfd_mmap() */
#define ERR_RING_MMAP	(E(EACCES) | E(EINVAL) | E(ENOMEM) | E(EINTR))
/* A uffd ioctl on /proc/self/pagemap: do_pagemap_cmd()'s -ENOIOCTLCMD */
#define ERR_WRONG_FD	E(ENOTTY)
/* userfaultfd_ioctl() answers an unknown command with EINVAL, not ENOTTY */
#define ERR_UNKNOWN_IOCTL E(EINVAL)
/* EAGAIN: madvise_vma_behavior()'s ENOMEM; EINTR: mmap_write_lock_killable() */
#define ERR_MADVISE	(E(EINVAL) | E(ENOMEM) | E(EAGAIN) | E(EINTR))


enum family { F_READBACK, F_WPCLEAR, F_SIGBUS, F_IOCTL, F_FORK, F_RING, F_N };
extern const char *const family_name[F_N];
extern unsigned long fails[F_N], checks[F_N];
extern unsigned long total_fails, op_index;
extern const char *volatile op_name;
extern uint64_t seed;
extern long psz;
extern char args[160];	/* the current call's arguments, for reports */

/* ---- the PRNG (fuzz/uffd-model.c) */
uint64_t rng_next(uint64_t *s);
extern uint64_t rs;	/* the main thread's stream, seeded with the seed */
uint64_t rnd(uint64_t n);
bool chance(unsigned int percent);

/* ---- reporting: one failure of family F; one call judged */
void failure(enum family f, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void judge(const char *what, int ret, int e, bool must_fail, uint64_t allowed);

/* ---- the pool */

struct slot {
	int fd;			/* -1: empty */
	uint64_t features;
	struct uffd_ring_header *ring;	/* mapped ring or NULL */
	size_t ring_size;
	bool ring_set;
};

enum reg_state { RS_NONE, RS_REG, RS_UNKNOWN };

struct region {
	char *addr;		/* NULL: no region */
	size_t npages;
	size_t guard;		/* PROT_NONE pages after it (ours) */
	uint64_t *shadow;	/* word 0 of each page */
	enum reg_state state;
	int slot;		/* RS_REG: which slot */
	uint64_t mode;		/* RS_REG: registration mode */
	bool wp_dropped;	/* registered without MODE_WP at some point */
};

/*
 * A range for an ioctl.  bad: structurally invalid (unaligned, empty,
 * wrapping, outside the user address space) -- every range ioctl must fail;
 * hole: valid but nothing is mapped there -- every ioctl that needs a VMA
 * must fail; whole: exactly one region.
 */
struct range { uint64_t start, len; bool valid, whole, bad, hole; };

extern struct slot slots[NSLOTS];
extern struct region regions[NREGIONS];
extern pthread_mutex_t pool_lock;
extern volatile int main_wants_pool;	/* the resolver steps aside */
extern unsigned long ring_opens, ring_setups, ring_open_err, ring_setup_err;
extern pthread_rwlock_t map_lock;	/* writers read, main changes maps */
extern uint64_t kernel_features;
extern bool have_ring, want_ring;
extern volatile int stop_threads, stop_writers;
extern char *src_buf;
extern int scan_fd;
/* Where every thread is, for a hang report. */
extern volatile unsigned long writer_at[NWRITERS];
extern volatile int resolver_at;
extern int npend;	/* resolutions waiting for an event to be read */
extern volatile unsigned long last_addr, last_flags, last_count;
extern volatile int last_err;
extern volatile unsigned long zeropage_marker_refusals;
extern char *zero_page;

bool pool_has_sigbus(void);
void on_fault(int sig);	/* SIGBUS and SIGSEGV: for safe_access() */
int safe_access(volatile uint64_t *p, bool store, uint64_t val, uint64_t *out);
void *resolver_main(void *arg);
void *writer_main(void *arg);
void region_new(struct region *r);
void region_drop(struct region *r);
struct region *pick_region(void);
struct range pick_range(struct region *r);
struct slot *pick_slot(void);
/* The readback invariant: word 0 of page I of R equals its shadow. */
void check_word(struct region *r, size_t i, const char *when);

/* ---- the operations (fuzz/uffd-ops.c) */
void slot_close(struct slot *s);
void op_api_garbage(void);
void op_slot_reopen(void);
void op_register(void);
void op_unregister(void);
void op_writeprotect(void);
void op_copy_zero(void);
void op_wake_continue(void);
void op_wrong_fd(void);
void op_scan(void);
void op_ring(void);
void op_write(void);
void op_read(void);
void op_remap_region(void);
void op_mremap(void);
void op_madvise(void);
void op_fork(void);

#endif
