/* SPDX-License-Identifier: LGPL-2.1-or-later OR MIT */
/*
 * snapshot.h: the snapshot engine (snapshot.c) as the session API
 * (session.c) uses it.  Not exported.
 */
#ifndef UFFDWP_SNAPSHOT_H
#define UFFDWP_SNAPSHOT_H

#include <pthread.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "internal.h"

#define ST_PENDING	0u
#define ST_COPYING	1u
#define ST_CLAIMED	2u
#define ST_SPILLED	3u
#define ST_DONE		4u
#define ST_SAVED	5u	/* + slot */

#define CHUNK		UW_HPAGE_SIZE
#define DEFAULT_CAP	(16UL << 20)
#define SNAP_FLAGS	(UFFDWP_SNAP_KERNEL_FAULTS | UFFDWP_SNAP_NO_UNPOPULATED | \
			 UFFDWP_SNAP_USER_MODE_ONLY | UFFDWP_SNAP_DISCARD_ZERO | \
			 UFFDWP_SNAP_DISCARD_FAIL)

struct uffdwp_snapshot {
	uint32_t magic;			/* UW_SNAPSHOT_MAGIC or
					 * UW_SESSION_MAGIC while alive */
	size_t self_len;
	pid_t owner;			/* the process that created it: in a
					 * child of fork() the copy is inert */
	struct uw_regions rs;
	struct uffdwp_snapshot_opts opts;	/* sink_fd: our duplicate */
	int uffd, stop_fd;
	int kick_fd;			/* eventfd: faults were deferred */
	int done_fd;			/* eventfd: readable once DONE (the
					 * caller's poll, snapshot-fd.c) */
	bool sink_owned;		/* opts.sink_fd is ours to close */
	bool discard_zero;		/* a page discarded before it was
					 * copied is stored as zeroes */
	_Atomic int saving;		/* the handler is in a save */
	pthread_t handler, copier;
	bool handler_started, copier_started, registered;

	pthread_mutex_t lock;		/* done, error, the stats */
	pthread_cond_t changed;		/* go or cancel changed */
	pthread_cond_t finished;	/* done became true */
	bool go;			/* protect phase over */
	bool cancel;
	bool done;
	int error;
	int handler_error;		/* the handler could not save a page,
					 * or one not copied was discarded */

	_Atomic uint32_t *state;
	size_t state_len;
	_Atomic uint64_t *huge;		/* page bits: in a PMD-mapped block */
	size_t huge_len;
	char *side;
	pthread_mutex_t slot_lock;	/* free_slot, nfree: held for a push
					 * or a pop, never across a copy */
	uint32_t *free_slot;		/* stack of free slot numbers */
	size_t nslots, nfree, slots_len;
	size_t nfree_min;		/* low-water mark of nfree */
	char *chunk;

	/* Spill: pages go to SPILL_FD at SPILL_BASE + page index * page
	 * size.  SINK_POSITIONAL: that is the sink file itself, written by
	 * the copier with pwrite(2) at the same offsets. */
	int spill_fd, memfd;
	int pagemap_fd;			/* /proc/self/pagemap, or -1 */
	bool sink_positional;
	off_t spill_base;
	uint64_t spill_bytes;		/* memfd: held now */

	/*
	 * Sessions: SET holds this snapshot's pages (NULL for a one-off
	 * snapshot: every page), RANK the number of SET's pages before each
	 * of its words, DIRTY the pages unprotected since the last instant.
	 * INSTANT_LOCK: held by an instant, and by the handler to read a
	 * batch of messages and handle its discards, and for each fault.  The sink gets PREFIX (DATA_OFF bytes:
	 * the file header) before the pages.
	 */
	bool session, need_base;
	/* Sessions: UNMAP and REMAP events asked for (REPLACE_EVENTS); one
	 * over a region was read since the last instant (REPLACED), how many
	 * ever (NREPLACED); KSM_CHECK: KSM runs, so the instant also looks
	 * for pages that lost their protection without an event (session.c). */
	bool replace_events, ksm_check;
	atomic_bool replaced;
	atomic_ulong nreplaced;
	pthread_mutex_t instant_lock;
	size_t nhuge;			/* blocks find_huge_blocks() marked */
	_Atomic uint64_t *set, *dirty;
	uint64_t *rank;
	size_t words, bitmap_len;
	uint64_t session_id, taken;
	uint32_t kind;
	/* Regions added or removed since the last instant (session-regions.c):
	 * the next delta is marked UFFDWP_FILE_REGIONS_CHANGED (FILE_FLAGS
	 * is this snapshot's). */
	bool regions_changed;
	uint32_t file_flags;
	char *prefix;
	off_t data_off;
	/* SUMS: each stored page's checksum (uw_file_sum()) by its position
	 * in the file, for the file's trailer; PAGE_BUF: a page read back
	 * from the file (spilled pages, a pre-copy's earlier rounds). */
	uint64_t *sums;
	size_t sums_len;
	char *page_buf;

	/*
	 * Pre-copy (precopy.c): a session's userfaultfd also has the
	 * write-log ring (RING, RING_LEN; the entries below RING_CONSUMER
	 * are consumed) and may switch to async WP.  ASYNC_MODE: it is in
	 * async mode, so a fault message is stale (its write was resolved by
	 * the kernel after the switch) and the handler leaves it alone; set
	 * and read under INSTANT_LOCK.  FULL_LAYOUT: the file stores every
	 * page at its index (a base) while SET holds only the pages the
	 * copier still has to write.
	 */
	void *ring;
	size_t ring_len;
	uint64_t ring_consumer;
	bool async_mode, full_layout;
	bool anon_only;			/* every region private anonymous
					 * (async between snapshots only then) */

	/*
	 * Reading the userfaultfd's messages (read_batch(), in
	 * snapshot-handler.c): whoever holds READ_LOCK (recursive) may read;
	 * discards are handled at once, faults go to DEFERRED (NDEFERRED of
	 * DEFERRED_CAP) for the handler, which KICK_FD wakes.  READERS: threads between a read and
	 * the end of handling its discards (the copier waits for none before
	 * trusting what it copied).  ZEROED: pages of the set discarded
	 * before they were copied (stored as zeroes in DISCARD_ZERO mode; the
	 * copier fails the snapshot with -EAGAIN otherwise).
	 */
	pthread_mutex_t read_lock;
	_Atomic int readers;
	struct uffd_msg *deferred;
	size_t ndeferred, deferred_cap;
	_Atomic uint64_t *zeroed;

	struct uffdwp_snapshot_stats st;
	uint64_t t_start;
};


/* The object, its userfaultfd (sync WP, EVENT_REMOVE), buffers,
 * registration and fault handler thread: shared by both APIs. */
int uw_snap_create(struct uffdwp_snapshot **out,
		   const struct uffdwp_region *regions, size_t nr,
		   const struct uffdwp_snapshot_opts *opts, bool session);
void uw_snap_destroy(struct uffdwp_snapshot *s);
/* -EINVAL for unknown or contradictory flags or a non-zero reserved word. */
int uw_snap_check_flags(unsigned int flags, const uint64_t *reserved,
			size_t nreserved);
/* Pick where spilled pages go for the sink in s->opts. */
int uw_snap_setup_spill(struct uffdwp_snapshot *s);
/* Mark the PMD-mapped 2 MiB blocks (s->nhuge counts them). */
void uw_snap_find_huge(struct uffdwp_snapshot *s);
/* All of [P, P + LEN) written to FD (UW_IO_WRITE: at its offset;
 * IO_PWRITE: at OFF) or read from it at OFF, in pieces a pipe or tmpfs
 * takes well; 0 or -errno (-ENOSPC: FD takes no more, -EIO: a read found
 * the end of the file). */
enum uw_io { IO_WRITE, IO_PWRITE, IO_PREAD };
int uw_io_all(int fd, char *p, size_t len, off_t off, enum uw_io op);
/* A thread of ours (every signal blocked): 0 or -errno (-ENOMEM when
 * pthread_create(3) says EAGAIN). */
int uw_snap_start_thread(pthread_t *t, void *(*fn)(void *), void *arg);
/* FN(ARG) on a thread of the library's own, on a stack the library mapped
 * (snapshot.c says why), the caller waiting: FN's return, or -ENOMEM. */
int uw_run_aside(int (*fn)(void *arg), void *arg);
void *uw_snap_copier_main(void *arg);
int uw_snap_unprotect_all(struct uffdwp_snapshot *s);
/* Stop saving with ERR (the first wins) and let every writer go. */
void uw_snap_abort(struct uffdwp_snapshot *s, int err);
/* Mark the snapshot done with ERR and wake its waiters. */
void uw_snap_finish(struct uffdwp_snapshot *s, int err);
/* The completion descriptor (snapshot-fd.c): made readable by
 * uw_snap_finish() (under s->lock), emptied by a session's next instant
 * (under s->lock). */
void uw_done_signal(struct uffdwp_snapshot *s);
void uw_done_drain(struct uffdwp_snapshot *s);
/* The handle SS/S if it is a live one of that kind (a session, or a
 * one-off snapshot), else NULL (handle.c). */
struct uffdwp_snapshot *uw_session_of(struct uffdwp_session *ss);
struct uffdwp_snapshot *uw_snapshot_of(struct uffdwp_snapshot *s);


/*
 * Protect (WP) or unprotect [ADDR, ADDR + LEN), and any userfaultfd ioctl
 * on S: on -EAGAIN (an event pending) read the events (handling discards,
 * deferring faults to the handler) and try again.  0 or -errno.
 */
int uw_snap_wp(struct uffdwp_snapshot *s, uintptr_t addr, size_t len,
	       bool wp, bool wake);
int uw_snap_ioctl(struct uffdwp_snapshot *s, unsigned long req, void *arg);
/* What a snapshot fails with when unprotecting its range said ERR:
 * -EFAULT when the range is no longer mapped, else -EIO. */
int uw_snap_gone_err(int err);
/* True in a process other than the one that created S (a child of
 * fork()): the API then touches nothing and returns -ECHILD. */
bool uw_snap_foreign(const struct uffdwp_snapshot *s);
/* Free S's memory and close its descriptors in a child of fork(): no
 * thread, lock or ioctl of the parent's is touched. */
void uw_snap_forget(struct uffdwp_snapshot *s);
/* A duplicate (F_DUPFD_CLOEXEC) of the caller's sink FD: >= 0 or -errno
 * (-EBADF: FD is not open). */
int uw_snap_dup_sink(int fd);

/* Reading our own memory without a fault (process_vm_readv(2), plain
 * copies where it is not allowed): 0, or -EFAULT when part of [SRC,
 * SRC + LEN) is not mapped readable.  _v fills LOCAL's NLOCAL buffers
 * (their lengths add up to LEN). */
int uw_read_self(void *dst, uintptr_t src, size_t len);
/* The caller's argument structs and output pointers, reached without a
 * fault: LEN bytes from SRC into DST, or VAL stored at OUT (a void **);
 * 0, or -EINVAL when the caller's pointer is not readable (writable).
 * Where process_vm_readv/writev(2) are refused, plain copies. */
int uw_copy_in(void *dst, const void *src, size_t len);
int uw_store_ptr(void *out, void *val);
int uw_read_self_v(const struct iovec *local, size_t nlocal, uintptr_t src,
		   size_t len);

/*
 * Before anything is allocated: every region mapped (-EFAULT if not), by
 * mincore(2), which allocates nothing.  Then, on the sorted copy: each
 * region covered by mappings of one kind, readable and writable (-EINVAL:
 * PROT_NONE, read-only, or anonymous and file-backed mixed), from
 * /proc/self/maps; *ANON_PRIVATE tells whether every region is private
 * anonymous memory.  Without /proc the second check is skipped
 * (*ANON_PRIVATE false).
 */
int uw_regions_mapped(const struct uffdwp_region *r, size_t nr);
int uw_regions_check_maps(const struct uw_regions *rs, bool *anon_private);
/* Whether a region holds part of the calling thread's stack (as
 * pthread_getattr_np(3) gives it) or its thread-local storage. */
bool uw_regions_hold_own_thread(const struct uw_regions *rs);

/*
 * Sessions (session.c), as the pre-copy (precopy.c) and the regions'
 * changes (session-regions.c) use them.  uw_session_idle: -EBUSY while a
 * snapshot runs; else 0, its copier joined.  uw_session_prepare:
 * uw_session_idle(), then FD made the sink.  uw_session_hold/release: the
 * handler's instant lock.  uw_session_instant: the instant (PREPARE
 * first, under the instant lock: it may add pages to the dirty bitmap or
 * fail it), then the copier's start; 0 or -errno (the next snapshot is
 * then a base).
 */
int uw_session_idle(struct uffdwp_snapshot *s);
int uw_session_prepare(struct uffdwp_snapshot *s, int fd);
/* Under the instant lock, before a delta's set is taken: pages neither
 * dirty nor write-protected (memory replaced under the session) marked
 * dirty, the regions registered again; -EFAULT/-EINVAL when a region is
 * not mapped or not the same kind any more (session.c). */
int uw_session_check_replaced(struct uffdwp_snapshot *s);
/* The regions checked (-EFAULT/-EINVAL) and registered again. */
int uw_session_reregister(struct uffdwp_snapshot *s);
bool uw_ksm_running(void);
void uw_session_hold(struct uffdwp_snapshot *s);
void uw_session_release(struct uffdwp_snapshot *s);
int uw_session_instant(struct uffdwp_snapshot *s, bool base, uint64_t t_start,
		       int (*prepare)(struct uffdwp_snapshot *s, void *arg),
		       void *arg);

/*
 * Async mode between snapshots and the ring's harvests (session-async.c).
 * uw_set_async: UFFDIO_SET_MODE on or off.  uw_ring_harvest: the pages
 * the ring logged since the last harvest into MAP (after an overflow,
 * every page not protected): a pre-copy round protects them again (the
 * scan too), an instant's reset protects them (the scan only reports), a
 * fold protects nothing.  uw_session_go_async: the copier, after a
 * session's copy succeeded: async mode where the ring, UFFDIO_SET_MODE
 * and no huge block allow it.  uw_session_fold: under the instant lock,
 * the ring's pages into the dirty bitmap (0 in sync mode);
 * uw_session_fold_held takes the lock.  uw_session_leave_async: under the
 * instant lock, back to sync mode and the ring harvested into the dirty
 * bitmap (0 in sync mode).  UW_SESSION_SYNC_BETWEEN: test and benchmark
 * seam, sessions stay in sync mode between snapshots.
 */
enum uw_harvest { UW_HARVEST_ROUND, UW_HARVEST_INSTANT, UW_HARVEST_FOLD };
int uw_set_async(struct uffdwp_snapshot *s, bool on);
int uw_ring_harvest(struct uffdwp_snapshot *s, _Atomic uint64_t *map,
		    enum uw_harvest how);
void uw_session_go_async(struct uffdwp_snapshot *s, bool aside);
/* Back to sync mode now (the ring harvested), from the caller's thread:
 * before a registration, which async mode would let any memory pass. */
int uw_session_sync_now(struct uffdwp_snapshot *s);
int uw_session_fold(struct uffdwp_snapshot *s);
int uw_session_fold_held(struct uffdwp_snapshot *s);
int uw_session_leave_async(struct uffdwp_snapshot *s);
/* uffdwp_session_dirty()'s count, the ring folded in (async-signal-safe:
 * without the instant lock, the ring's pending pages counted aside). */
ssize_t uw_session_count_dirty(struct uffdwp_snapshot *s);
extern bool uw_session_sync_between;

#endif
