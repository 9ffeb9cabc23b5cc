/* SPDX-License-Identifier: LGPL-2.1-or-later OR MIT */
/*
 * uffdwp.h - libuffdwp: live snapshots and dirty-page tracking of the
 * calling process's memory with userfaultfd write-protection.
 *
 * Works on any kernel from 6.12 up: features are probed at run time and
 * the library falls back (or says why it cannot) when one is missing.
 *
 * Conventions (all functions):
 *   - Errors are returned as a negative errno value; nothing is printed and
 *     the library never aborts.  Functions returning a pointer-to-object
 *     take an output argument instead and return 0 or -errno.
 *   - "Thread safety" says what may be called concurrently.  Unless stated
 *     otherwise an object must not be used by two threads at once, but
 *     every other thread of the process may keep reading and writing the
 *     memory being snapshotted or tracked: that is the point.
 *   - Memory the library writes (buffers, bitmaps, its objects) is mmap()ed
 *     before any region is protected, so it never lies inside a region.
 *   - Pointers: NULL is -EINVAL wherever a pointer is required.  The
 *     region arrays, option structs and output pointers of the functions
 *     that create objects are reached without a fault, so an unreadable
 *     (unwritable) one is -EINVAL too.  A handle must be one the library
 *     returned and not yet freed; any other non-NULL handle, and buffers
 *     the library writes into (PAGES, BUF, REGIONS out), are undefined
 *     behaviour, as in any C library.
 *   - Async-signal-safe: uffdwp_version(), uffdwp_version_at_least(),
 *     uffdwp_backend_name(), uffdwp_backend_from_name(),
 *     uffdwp_tracker_backend(), uffdwp_session_dirty(); nothing else
 *     (libuffdwp(7)).
 *
 * See docs/libuffdwp.md for the design and the choices (THP, unpopulated
 * memory, fork, kernel-mode accesses).
 */
#ifndef UFFDWP_H
#define UFFDWP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UFFDWP_VERSION_MAJOR 0
#define UFFDWP_VERSION_MINOR 4

/*
 * uffdwp_version - the version of the library actually loaded, which may
 * differ from the UFFDWP_VERSION_* this program was compiled with.  Returns
 * 0, or -EINVAL for a NULL pointer.  uffdwp_version_at_least() is true when
 * the loaded library has MAJOR's interface with at least MINOR's
 * additions.  Thread safety: any thread.
 */
int uffdwp_version(int *major, int *minor);
bool uffdwp_version_at_least(int major, int minor);

/* One range of the caller's memory: ADDR and LEN page-aligned, LEN > 0. */
struct uffdwp_region {
	void *addr;
	size_t len;
};

/* ------------------------------------------------------------------ */
/* Opening and feature probing                                         */
/* ------------------------------------------------------------------ */

/* uffdwp_open() flags. */
#define UFFDWP_OPEN_KERNEL_FAULTS (1u << 0) /* do not set UFFD_USER_MODE_ONLY */
#define UFFDWP_OPEN_NO_DEVICE	  (1u << 1) /* skip /dev/userfaultfd */
#define UFFDWP_OPEN_NO_SYSCALL	  (1u << 2) /* skip the userfaultfd syscall */
#define UFFDWP_OPEN_BLOCKING	  (1u << 3) /* no O_NONBLOCK on the fd */

/*
 * uffdwp_open - open a userfaultfd and negotiate its API.
 *
 * Tries /dev/userfaultfd (ioctl USERFAULTFD_IOC_NEW) first, then the
 * userfaultfd(2) syscall.  The fd is O_CLOEXEC and O_NONBLOCK (unless
 * UFFDWP_OPEN_BLOCKING) and UFFD_USER_MODE_ONLY (unless
 * UFFDWP_OPEN_KERNEL_FAULTS): with it, a write to a protected page made by
 * the kernel on the process's behalf (read(2) into it, for instance) fails
 * with EFAULT instead of waiting.  UFFDIO_API is then called asking for
 * FEATURES; *GOT (if not NULL) receives every feature the kernel reports.
 *
 * Returns the fd (>= 0) or:
 *   -EINVAL   unknown bit in FLAGS, or both ways excluded;
 *   -EPERM    neither way is allowed for this caller (no access to
 *             /dev/userfaultfd and vm.unprivileged_userfaultfd=0 without
 *             CAP_SYS_PTRACE);
 *   -ENOSYS   the kernel has no userfaultfd at all;
 *   -EOPNOTSUPP  the kernel lacks a feature asked for in FEATURES;
 *   other     what open/ioctl/syscall returned.
 * Thread safety: may be called from any thread at any time.
 */
int uffdwp_open(unsigned int flags, uint64_t features, uint64_t *got);

/* What this kernel (and this process's permissions) allow. */
struct uffdwp_features {
	uint64_t api_features;	/* raw UFFDIO_API features reported */
	bool device;		/* /dev/userfaultfd could be opened */
	bool syscall;		/* userfaultfd(2) works (user-mode-only) */
	bool wp;		/* UFFD_FEATURE_PAGEFAULT_FLAG_WP: sync WP */
	bool wp_unpopulated;	/* UFFD_FEATURE_WP_UNPOPULATED */
	bool wp_async;		/* UFFD_FEATURE_WP_ASYNC */
	bool pagemap_scan;	/* PAGEMAP_SCAN ioctl on /proc/self/pagemap */
	bool wp_ring;		/* UFFD_FEATURE_WP_RING write-log ring */
	bool soft_dirty;	/* pagemap reports soft-dirty (bit 55); probed
				 * without writing clear_refs */
	bool thp;		/* transparent hugepages not "never" */
	bool set_mode;		/* UFFDIO_SET_MODE switches WP between sync
				 * and async on a live context (since 0.3;
				 * it fills padding, the layout is 0.2's) */
	bool kernel_faults;	/* this process may open a userfaultfd that
				 * handles kernel-mode faults (without
				 * UFFD_USER_MODE_ONLY); when false, snapshots
				 * and sessions fall back to user-mode faults
				 * and read(2) into a protected page fails
				 * with EFAULT (it fills padding; a library
				 * from before it leaves it false) */
	size_t page_size;
	uint64_t __reserved[8];	/* room to grow: zeroed by the library */
};

/*
 * uffdwp_probe - fill *F with what the running kernel supports.
 *
 * Opens (and closes) a userfaultfd, issues a PAGEMAP_SCAN on a scratch
 * mapping and reads the soft-dirty bit of a scratch page it wrote; it
 * changes nothing else in the process (it never writes clear_refs).
 * Returns 0 (even when userfaultfd is unavailable: every flag is then
 * false) or -EINVAL if F is NULL.
 * Thread safety: any thread, any time; the result is cached after the
 * first call (uffdwp_probe_fresh() probes again), unless a step failed
 * for want of descriptors or memory (EMFILE, ENFILE, ENOMEM): such a
 * result is returned but not cached.
 */
int uffdwp_probe(struct uffdwp_features *f);
int uffdwp_probe_fresh(struct uffdwp_features *f);

/*
 * uffdwp_feature_names - write a space-separated list of the features set
 * in F ("wp wp-unpopulated wp-async pagemap-scan ...") into BUF of SIZE
 * bytes.  Returns the length it needed (like snprintf) or -EINVAL.
 * Thread safety: any thread.
 */
int uffdwp_feature_names(const struct uffdwp_features *f, char *buf,
			 size_t size);

/* ------------------------------------------------------------------ */
/* Snapshot                                                            */
/* ------------------------------------------------------------------ */

/*
 * A sink callback receives the snapshot in address order, chunk by chunk:
 * ADDR is where DATA came from in the process, LEN its length (a multiple
 * of the page size).  DATA is valid only during the call.  Return 0 to go
 * on or a negative errno to stop the snapshot with that error.  The
 * callback runs on the library's copier thread.  It may read and write the
 * snapshotted regions (a write to a page not copied yet is saved like any
 * other and never waits for the copier); it deadlocks only if it waits for
 * the snapshot itself: uffdwp_snapshot_wait(), _cancel() or _free() on
 * it, directly or through another thread.
 */
typedef int (*uffdwp_sink_fn)(void *arg, const void *addr, const void *data,
			      size_t len);

struct uffdwp_snapshot_opts {
	/* Exactly one sink: SINK_FD > 0 receives the regions' bytes one
	 * after the other in address order (write(2), no header), or SINK
	 * is called.  Set SINK_FD to -1 when using SINK.  Descriptor 0 is
	 * refused (-EINVAL), so that a zero-filled struct is invalid rather
	 * than a snapshot written to standard input; dup(2) it if needed.
	 * The library writes to its own duplicate (F_DUPFD_CLOEXEC), closed
	 * when the copier is done; -EBADF if SINK_FD is not open. */
	int sink_fd;
	uffdwp_sink_fn sink;
	void *sink_arg;
	/* Cap on the side buffer that keeps pages written before the copier
	 * reached them, in bytes; 0 = 16 MiB; rounded down to pages, at
	 * least one page.  When it is full, further pages spill with
	 * pwrite(2): into the sink itself when SINK_FD is a regular file
	 * without O_APPEND (each page at its own offset), else into a memfd
	 * the copier drains.  A writer never waits for the copier. */
	size_t side_cap;
	/* Flags: UFFDWP_SNAP_*. */
	unsigned int flags;
	/* Room for options to come: must be zero (-EINVAL otherwise), so a
	 * zero-initialised struct keeps its meaning in later versions. */
	uint64_t __reserved[8];
};

/*
 * By default the snapshot's userfaultfd handles kernel-mode faults too, so
 * that read(2), recv(2) and other system calls writing into a page not yet
 * copied wait for it like a user-space write; where the process may not
 * (no CAP_SYS_PTRACE, vm.unprivileged_userfaultfd = 0, no access to
 * /dev/userfaultfd) it falls back to UFFD_USER_MODE_ONLY and sets
 * stats.user_mode_only: such system calls then fail with EFAULT while the
 * snapshot runs.
 */
#define UFFDWP_SNAP_KERNEL_FAULTS (1u << 0) /* kernel-mode faults or -EPERM:
						no fallback */
#define UFFDWP_SNAP_NO_UNPOPULATED (1u << 1) /* do not use WP_UNPOPULATED:
						populate (read) instead */
#define UFFDWP_SNAP_USER_MODE_ONLY (1u << 2) /* user-mode faults only */
/*
 * A page discarded (MADV_DONTNEED, MADV_FREE, MADV_REMOVE) while a snapshot
 * runs, before the copier reached it: DISCARD_ZERO stores it as zeroes
 * (what the program reads from memory it gave back; the default when every
 * region is private anonymous memory), DISCARD_FAIL fails the snapshot
 * with -EAGAIN (the default otherwise).  Both at once: -EINVAL.  A
 * library from before these flags refuses them with -EINVAL.
 */
#define UFFDWP_SNAP_DISCARD_ZERO  (1u << 3)
#define UFFDWP_SNAP_DISCARD_FAIL  (1u << 4)

struct uffdwp_snapshot_stats {
	uint64_t pause_ns;	/* protect phase: writers may wait this long */
	uint64_t start_ns;	/* whole uffdwp_snapshot_start() */
	uint64_t total_ns;	/* start to copier finished */
	uint64_t pages;		/* pages in the regions */
	uint64_t pages_copied;	/* pages sent to the sink so far */
	uint64_t faults;	/* write faults handled */
	uint64_t saved;		/* pages copied to the side buffer */
	uint64_t side_waits;	/* always 0: a full side buffer spills */
	uint64_t side_peak;	/* side buffer high-water mark, bytes */
	uint64_t side_cap;	/* side buffer cap, bytes */
	uint64_t fixed_bytes;	/* other memory: chunk buffer + page states */
	bool used_unpopulated;	/* WP_UNPOPULATED protected empty pages */
	bool user_mode_only;	/* kernel-mode writes into the regions fail
				 * (EFAULT) until the copier reached them */
	bool done;		/* copier finished (success or not) */
	int error;		/* 0, or the -errno that stopped it */
	uint64_t spilled;	/* pages saved to the spill file */
	uint64_t spill_peak;	/* memfd spill high-water mark, bytes (0
				 * when spilling into the sink file) */
	uint64_t huge_blocks;	/* 2 MiB blocks PMD-mapped at the start */
	uint64_t huge_saves;	/* faults that saved a whole 2 MiB block */
	uint64_t fault_max_ns;	/* longest handling of one fault: claim,
				 * save, unprotect (what a writer waits for
				 * besides being woken) */
	uint64_t epoch;		/* sessions: this snapshot's epoch (0 for
				 * one-off snapshots) */
	uint64_t precopy_rounds; /* uffdwp_session_precopy(): rounds copied
				  * before the instant (since 0.3) */
	uint64_t precopy_pages;	/* pages those rounds wrote (since 0.3) */
};

struct uffdwp_snapshot;

/*
 * uffdwp_snapshot_start - take a point-in-time snapshot of NR regions.
 *
 * Registers the regions with a new userfaultfd in sync WP mode, starts the
 * fault handler and write-protects every region: the snapshot instant is
 * the end of that protect phase (a writer that faults during it waits until
 * it ends, so the copy is the memory state at one instant even across
 * regions).  Then a copier thread streams the regions to the sink in
 * address order while the caller's threads keep running; a write to a page
 * not yet copied saves that page to the side buffer (or spills it) first,
 * and never waits for the copier.  A write into a 2 MiB block that was
 * PMD-mapped when the snapshot started saves the whole block at once, so
 * the huge page stays huge.  Returns at once after the protect phase; *OUT
 * receives the handle.  A regular file sink is written with pwrite(2) from
 * its current offset, which is left at the end of the snapshot.
 *
 * Regions: private anonymous (or shmem/hugetlb if the kernel supports WP
 * there) read-write memory of this process, page-aligned, non-empty,
 * non-overlapping, not registered with another userfaultfd; they must stay
 * mapped until the snapshot is done.  Regions may be given in any order.
 * They are checked before anything is allocated.  One unmapped or made
 * inaccessible while the snapshot runs fails it with -EFAULT (the library
 * reads them with process_vm_readv(2): no signal).  They may include the
 * calling thread's stack or memory its libc writes: the protect phase
 * runs on a thread of the library's own.
 *
 * After fork() the child's copy of the handle is inert: in the child,
 * uffdwp_snapshot_free() releases only the child's copies of the library's
 * memory and descriptors (nothing of the parent's is touched) and the
 * other calls return -ECHILD.
 *
 * Returns 0 or:
 *   -EINVAL   bad pointer, NR 0, unaligned/empty/overlapping region, a
 *             region PROT_NONE, read-only or of mixed mapping kinds, no
 *             sink or two sinks, unknown or conflicting flag;
 *   -EFAULT   part of a region is not mapped;
 *   -EBADF    SINK_FD is not an open descriptor;
 *   -EOPNOTSUPP  no sync WP on anonymous memory (UFFD_FEATURE_PAGEFAULT_FLAG_WP);
 *   -EBUSY    a region is registered with another userfaultfd;
 *   -ENOMEM   out of memory, or no thread could be created
 *             (pthread_create(3)'s EAGAIN);
 *   -EMFILE, -ENFILE  out of descriptors;
 *   other     from uffdwp_open(), memfd_create(2) or the kernel.
 * Thread safety: any thread; several snapshots of disjoint regions may run
 * at once.
 */
int uffdwp_snapshot_start(struct uffdwp_snapshot **out,
			  const struct uffdwp_region *regions, size_t nr,
			  const struct uffdwp_snapshot_opts *opts);

/*
 * uffdwp_snapshot_wait - wait until the copier is done.  TIMEOUT_MS < 0
 * waits forever.  Returns 0 when the snapshot completed, -ETIMEDOUT,
 * -ECANCELED after uffdwp_snapshot_cancel(), or the error that stopped it:
 * the sink's (-errno of write(2) or pwrite(2), -ENOSPC when the sink fd
 * accepts no more bytes, or the callback's), the spill file's (-errno of
 * pwrite(2) when a page could not be saved: the writers then go on, the
 * snapshot is lost), -EAGAIN when pages not yet copied were discarded
 * (MADV_DONTNEED, MADV_FREE, MADV_REMOVE) while it ran in
 * UFFDWP_SNAP_DISCARD_FAIL mode, -EFAULT when a region was unmapped or made
 * inaccessible under it, or -EIO when protecting or unprotecting failed.
 * Thread safety: one waiter at a time; concurrently with cancel and stats.
 */
int uffdwp_snapshot_wait(struct uffdwp_snapshot *s, int timeout_ms);

/*
 * uffdwp_snapshot_cancel - stop the copier, unprotect everything and wake
 * every waiting writer.  Pages not yet sent never reach the sink.  Returns
 * 0, or -EALREADY if the snapshot had already finished.
 * Thread safety: any thread, concurrently with wait and stats; not from
 * the sink callback (return an error from it instead).
 */
int uffdwp_snapshot_cancel(struct uffdwp_snapshot *s);

/* uffdwp_snapshot_stats - copy the counters.  Returns 0 or -EINVAL.
 * Thread safety: any thread, any time while S exists. */
int uffdwp_snapshot_stats(struct uffdwp_snapshot *s,
			  struct uffdwp_snapshot_stats *st);

/*
 * uffdwp_snapshot_free - cancel if still running (it does not wait for the
 * copy: uffdwp_snapshot_wait() first for that), stop the threads,
 * unregister and free.  NULL is ignored.
 * Thread safety: once, when no other call on S runs.
 */
void uffdwp_snapshot_free(struct uffdwp_snapshot *s);

/*
 * uffdwp_snapshot_fd (since 0.4) - a descriptor that becomes readable
 * (POLLIN) when the snapshot has finished: copied, failed or cancelled,
 * the moment uffdwp_snapshot_wait() would return without waiting, and
 * stays readable from then on (like a pidfd); so a snapshot fits an event
 * loop (poll(2), epoll(7)).  It is an eventfd, O_CLOEXEC and O_NONBLOCK,
 * owned by the snapshot and closed by uffdwp_snapshot_free(): poll it,
 * do not read, write or close it.  uffdwp_snapshot_wait() then gives the
 * result.  Returns the descriptor, or -EINVAL (NULL S, or one that is
 * not a live snapshot handle where that can be seen: freed, garbage, a
 * session), -ECHILD in a child of fork().  Thread safety: any thread.
 */
int uffdwp_snapshot_fd(struct uffdwp_snapshot *s);

/*
 * Counters that can grow without new symbols (since 0.4): the caller sets
 * SIZE to sizeof(struct uffdwp_stats_v) as it was compiled; the library
 * fills min(SIZE, its own size) bytes, zeroes the caller's bytes past its
 * own, and stores that minimum in SIZE.  A field is present when SIZE
 * covers it: if (st.size >= offsetof(struct uffdwp_stats_v, FIELD) +
 * sizeof(st.FIELD)).  New fields are only ever added at the end, all
 * 64-bit.  The fields up to PRECOPY_PAGES mean what they mean in struct
 * uffdwp_snapshot_stats (the booleans are FLAGS bits, ERROR is the
 * -errno that stopped the snapshot).
 */
#define UFFDWP_STATS_DONE		(1u << 0)
#define UFFDWP_STATS_USED_UNPOPULATED	(1u << 1)
#define UFFDWP_STATS_USER_MODE_ONLY	(1u << 2)
/* Sessions: the writes since the last snapshot are resolved
 * by the kernel and logged in the write-log ring (async mode), not by the
 * session's handler thread. */
#define UFFDWP_STATS_ASYNC_BETWEEN	(1u << 3)

struct uffdwp_stats_v {
	uint32_t size;		/* in: the caller's size; out: bytes filled */
	uint32_t flags;		/* UFFDWP_STATS_* */
	int64_t error;
	uint64_t pause_ns;
	uint64_t start_ns;
	uint64_t total_ns;
	uint64_t pages;
	uint64_t pages_copied;
	uint64_t faults;
	uint64_t saved;
	uint64_t side_peak;
	uint64_t side_cap;
	uint64_t fixed_bytes;
	uint64_t spilled;
	uint64_t spill_peak;
	uint64_t huge_blocks;
	uint64_t huge_saves;
	uint64_t fault_max_ns;
	uint64_t epoch;
	uint64_t precopy_rounds;
	uint64_t precopy_pages;
	uint64_t nregions;	/* regions now (a session's may change) */
	uint64_t region_pages;	/* pages in those regions */
	uint64_t dirty_pages;	/* sessions: uffdwp_session_dirty() now;
				 * snapshots: 0 */
};

/*
 * uffdwp_snapshot_stats_v (since 0.4) - the counters of S into *ST as
 * above.  Returns 0, or -EINVAL: NULL or dead S (as for
 * uffdwp_snapshot_fd()), NULL ST, ST not readable and writable, SIZE
 * below 8, above 4096 or not a multiple of 8; -ECHILD in a child of
 * fork().  Thread safety: any thread, any time while S exists.
 */
int uffdwp_snapshot_stats_v(struct uffdwp_snapshot *s,
			    struct uffdwp_stats_v *st);

/* ------------------------------------------------------------------ */
/* Snapshot sessions and snapshot files (since 0.2)                    */
/* ------------------------------------------------------------------ */

/*
 * A session takes a series of snapshots of its regions (which may be
 * added and removed between snapshots since 0.4).  Its first
 * snapshot is a base (every page); each later one is a delta holding only
 * the pages written since the previous snapshot's instant, so its pause
 * and its cost follow what was written, not the size of the regions.
 * Between snapshots the regions stay write-protected: the first write to
 * a page after a snapshot is a round trip through the session's handler
 * thread (which notes the page and unprotects it), like a write during a
 * snapshot.  On a kernel with UFFDIO_SET_MODE and the write-log ring, a
 * session whose regions hold no PMD-mapped huge page at the instant runs
 * in async mode from the end of each copy to the next instant instead: the
 * kernel resolves first writes and logs them in the ring, the session's
 * dirty set (UFFDWP_STATS_ASYNC_BETWEEN says so).  Pages discarded with
 * MADV_DONTNEED, MADV_FREE or MADV_REMOVE count as written.  Where the
 * session falls back to user-mode faults (stats.user_mode_only), system
 * calls that write into the regions fail with EFAULT while it is in sync
 * mode, not only during a copy.
 *
 * Snapshots are written in the uffdwp snapshot file format (version 2,
 * in the writer's byte order, described in docs/libuffdwp.md): a 64-byte
 * header, the regions, a bitmap of the pages stored and a checksum of
 * all that, padding to a page, the stored pages in address order, then a
 * checksum per page and one of those.  uffdwp_snapshot_load() applies a
 * base and its deltas in epoch order and verifies every checksum
 * (version 1 files, without checksums, are still read).
 *
 * Memory replaced under a session between snapshots (mmap(MAP_FIXED),
 * munmap() and mmap() again, mremap() away and back) is found at the
 * next instant (its pages are neither written nor write-protected) and
 * stored by that delta as written; a region no longer mapped makes every
 * later snapshot fail with -EFAULT, one of another kind or protection
 * with -EINVAL.
 */
struct uffdwp_session;

struct uffdwp_session_opts {
	size_t side_cap;	/* as in uffdwp_snapshot_opts */
	unsigned int flags;	/* UFFDWP_SNAP_KERNEL_FAULTS,
				 * UFFDWP_SNAP_NO_UNPOPULATED or
				 * UFFDWP_SNAP_USER_MODE_ONLY */
	uint64_t __reserved[6];	/* must be zero */
};

/*
 * uffdwp_session_new - register NR regions (the rules of
 * uffdwp_snapshot_start()) with a new userfaultfd for a series of
 * snapshots.  Nothing is protected until the first snapshot.  OPTS may be
 * NULL (the defaults).
 * Returns 0 or the errors of uffdwp_snapshot_start() (there is no sink to
 * check).  Thread safety: any thread.
 */
int uffdwp_session_new(struct uffdwp_session **out,
		       const struct uffdwp_region *regions, size_t nr,
		       const struct uffdwp_session_opts *opts);

/* uffdwp_session_snapshot() flags. */
#define UFFDWP_SESSION_BASE (1u << 0)	/* every page, even if a delta would do */

/*
 * uffdwp_session_snapshot - take the session's next snapshot into FD, a
 * file, pipe or socket, from its current offset: a base when it is the
 * session's first, when the previous one failed or with
 * UFFDWP_SESSION_BASE, else a delta.  Returns at the snapshot instant,
 * like uffdwp_snapshot_start(); uffdwp_session_wait() waits for the copy.
 * The library writes to its own duplicate of FD, closed when the copy is
 * done.
 * Returns 0 or:
 *   -EINVAL   NULL SS, FD < 0, unknown flag; a region's memory is of
 *             another kind or protection than at the session's start;
 *   -EFAULT   part of a region is no longer mapped;
 *   -EBADF    FD is not open;
 *   -EBUSY    the previous snapshot has not finished (wait for it);
 *   -ENOMEM, or what the kernel returned (the session then stays usable
 *             and its next snapshot is a base).
 * Thread safety: one call on SS at a time; writers may run.
 */
int uffdwp_session_snapshot(struct uffdwp_session *ss, int fd,
			    unsigned int flags);

/*
 * uffdwp_session_wait - wait for the current snapshot as
 * uffdwp_snapshot_wait() does.  Besides its errors, -EAGAIN (in
 * UFFDWP_SNAP_DISCARD_FAIL mode): pages not yet copied were discarded
 * (MADV_DONTNEED and the like) while it ran, so the file cannot hold their
 * contents at the instant; take another snapshot (a base).  -ENOENT when
 * no snapshot was taken.
 * Thread safety: as uffdwp_snapshot_wait().
 */
int uffdwp_session_wait(struct uffdwp_session *ss, int timeout_ms);

/* uffdwp_session_stats - the counters of the current (or last) snapshot,
 * as uffdwp_snapshot_stats(); PAGES counts the pages it stores.  Returns 0,
 * -EINVAL or -ENOENT (no snapshot yet).  Thread safety: any thread. */
int uffdwp_session_stats(struct uffdwp_session *ss,
			 struct uffdwp_snapshot_stats *st);

/*
 * Pre-copy (since 0.3): a session's base snapshot whose pause follows what
 * is written while it is taken, not the size of the regions, as live
 * migration does it.  Needs a kernel with UFFDIO_SET_MODE and the
 * write-log ring (uffdwp_features.set_mode and .wp_ring) and WP on
 * unpopulated pages; FD must be a regular file opened without O_APPEND
 * (rounds write pages where they belong).
 *
 * The pages are copied while the writers run, in rounds: the first writes
 * every page, each later one the pages written since the previous one
 * (found in the ring, with no fault handled by the library: the kernel
 * resolves the writes in async mode).  When a round finds at most
 * TARGET_PAGES pages, or no fewer than the previous round, or after
 * MAX_ROUNDS rounds, the instant switches the userfaultfd to sync mode
 * and protects only the pages written since the last round; those are
 * then saved before their first write, as in any snapshot.  The file is a
 * base (every page, UFFDWP_FILE_BASE) holding the memory at that instant.
 * A write into a PMD-mapped huge page during the rounds splits its
 * mapping (async WP resolves 4 KiB at a time).
 */
struct uffdwp_precopy_opts {
	uint64_t target_pages;	/* 0: 1024 */
	unsigned int max_rounds; /* including the first; 0: 8 */
	unsigned int flags;	/* must be 0 */
	uint64_t __reserved[6];	/* must be zero */
};

/*
 * uffdwp_session_precopy - take the session's next snapshot as a base with
 * pre-copy into FD from its current offset.  Runs the rounds in the
 * calling thread (which must not write the regions) and returns at the
 * instant, like uffdwp_session_snapshot(); uffdwp_session_wait() waits
 * for the last pages.  Stats: pause_ns is the instant alone,
 * precopy_rounds and precopy_pages what came before it; PAGES counts
 * every page of the file, PAGES_COPIED those of the last set.  The session
 * goes on in sync mode; its next snapshot is a delta.  OPTS may be NULL.
 * Returns 0 or:
 *   -EINVAL   NULL SS, FD < 0 or not a regular file without O_APPEND,
 *             non-zero flags or reserved words;
 *   -EOPNOTSUPP  no UFFDIO_SET_MODE or ring (or the session was created
 *             with UFFDWP_SNAP_NO_UNPOPULATED);
 *   -EBUSY    the previous snapshot has not finished;
 *   -ENOMEM, the -errno of pwrite(2) on FD, or what the kernel returned:
 *             the session then stays usable, its next snapshot a base.
 * Thread safety: as uffdwp_session_snapshot().
 */
int uffdwp_session_precopy(struct uffdwp_session *ss, int fd,
			   const struct uffdwp_precopy_opts *opts);

/* uffdwp_session_dirty - pages written since the last snapshot instant
 * (what the next delta would store), or -EINVAL.  Thread safety: any
 * thread, except while uffdwp_session_add_region() or _remove_region()
 * runs. */
ssize_t uffdwp_session_dirty(struct uffdwp_session *ss);

/*
 * uffdwp_session_dirty_ranges (since 0.4) - the pages written since the
 * last snapshot instant (what the next delta would store; the pages
 * uffdwp_session_dirty() counts) as ranges: runs of adjacent pages, in
 * address order, a range never spanning two regions.  Stores the first
 * min(MAX, total) ranges in RANGES (NULL when MAX is 0) and returns the
 * total, so a return above MAX means "a larger array" (the set may have
 * grown meanwhile: writers run).  The set is not consumed.  Returns the
 * count or -EINVAL (NULL or dead SS, NULL RANGES with MAX > 0, RANGES not
 * writable for the ranges stored), -ECHILD in a child of fork().
 * Thread safety: any thread, except while uffdwp_session_add_region() or
 * _remove_region() runs.
 */
ssize_t uffdwp_session_dirty_ranges(struct uffdwp_session *ss,
				    struct uffdwp_region *ranges, size_t max);

/*
 * uffdwp_session_add_region, uffdwp_session_remove_region (since 0.4) -
 * a session's regions grow and shrink as the program's heap does.
 *
 * Adding: REGION is checked as uffdwp_session_new() checks regions
 * (before anything is allocated: mapped, one kind, readable and writable)
 * and registered; it is written in full by the next snapshot (a delta
 * stores every page of it) and tracked like the others from that
 * instant.  Removing: REGION must be one of the session's regions, as
 * given (same address and length); it is unprotected (a writer waiting
 * on it goes on, later writes raise no fault), unregistered, and its
 * pages leave the dirty set and every later snapshot.  Neither may run
 * while a snapshot is being copied (-EBUSY: uffdwp_session_wait() first).
 * The delta after a change records the new regions and is marked
 * UFFDWP_FILE_REGIONS_CHANGED (file format 3, which libraries before 0.4
 * refuse with -EPROTONOSUPPORT); uffdwp_snapshot_load() applies it on top
 * of the previous file.
 * Returns 0 or:
 *   -EINVAL   NULL or dead SS, REGION not readable, unaligned or empty;
 *             (add) PROT_NONE, read-only or of mixed kinds; (remove) the
 *             session's only region (free the session instead);
 *   -EFAULT   (add) part of REGION is not mapped;
 *   -EBUSY    a snapshot is running; (add) REGION overlaps one of the
 *             session's regions, or is registered with another
 *             userfaultfd;
 *   -ENOENT   (remove) REGION is not one of the session's regions;
 *   -ECHILD   in a child of fork();
 *   -ENOMEM, or what the kernel returned (the session is unchanged).
 * Thread safety: one call on SS at a time, and no other call on SS
 * (uffdwp_session_dirty() included) meanwhile; writers may run.
 */
int uffdwp_session_add_region(struct uffdwp_session *ss,
			      const struct uffdwp_region *region);
int uffdwp_session_remove_region(struct uffdwp_session *ss,
				 const struct uffdwp_region *region);

/*
 * uffdwp_session_fd (since 0.4) - as uffdwp_snapshot_fd() for the
 * session's current snapshot: readable once it has finished (so
 * uffdwp_session_wait() would not wait), not readable before the first
 * snapshot nor from the instant of the next one until that one finishes.
 * Owned by the session, closed by uffdwp_session_free().  Returns the
 * descriptor, -EINVAL (NULL or dead SS) or -ECHILD.  Thread safety: any
 * thread.
 */
int uffdwp_session_fd(struct uffdwp_session *ss);

/* uffdwp_session_stats_v (since 0.4) - uffdwp_session_stats() into a
 * struct uffdwp_stats_v (see uffdwp_snapshot_stats_v()); DIRTY_PAGES,
 * NREGIONS and REGION_PAGES are the session's now.  Returns 0, -EINVAL,
 * -ENOENT (no snapshot yet) or -ECHILD.  Thread safety: as
 * uffdwp_session_dirty_ranges(). */
int uffdwp_session_stats_v(struct uffdwp_session *ss,
			   struct uffdwp_stats_v *st);

/* uffdwp_session_free - cancel a running snapshot, unprotect, unregister and
 * free.  NULL is ignored.  In a child of fork(), as uffdwp_snapshot_free().  Thread safety: once, when no other call on SS
 * runs. */
void uffdwp_session_free(struct uffdwp_session *ss);

#define UFFDWP_FILE_BASE	0	/* uffdwp_snapshot_info.kind */
#define UFFDWP_FILE_DELTA	1
/* uffdwp_snapshot_info.flags (since 0.4): a delta whose regions differ
 * from the previous file's (uffdwp_session_add_region()); every page of a
 * region the previous file did not have is stored. */
#define UFFDWP_FILE_REGIONS_CHANGED	(1u << 0)

/* What a snapshot file's header says. */
struct uffdwp_snapshot_info {
	uint32_t version;	/* of the file format: 1 */
	uint32_t page_size;
	uint32_t kind;		/* UFFDWP_FILE_BASE or UFFDWP_FILE_DELTA */
	uint32_t nregions;
	uint64_t session;	/* random, shared by a session's snapshots */
	uint64_t epoch;		/* 0, 1, 2...: the session's snapshots so far */
	uint64_t pages_total;	/* pages in the regions */
	uint64_t pages;		/* pages stored in the file */
	uint64_t file_len;	/* bytes of the whole snapshot in the file */
	uint32_t flags;		/* UFFDWP_FILE_REGIONS_CHANGED (since 0.4;
				 * a library from before leaves it 0) */
	uint32_t __pad;
	uint64_t __reserved[2];
};

/*
 * uffdwp_snapshot_read_info - read the header of the snapshot file at FD's
 * current offset (with pread(2): the offset does not move), and up to MAX
 * of its regions (their recorded addresses and lengths) into REGIONS,
 * which may be NULL when MAX is 0.  Returns the number of regions in the
 * file (more than MAX when they did not all fit) or -EINVAL (NULL INFO),
 * -EBADMSG (not a uffdwp snapshot, truncated or inconsistent header, or
 * (version 2) the checksum of the header, regions and bitmap differs),
 * -EPROTONOSUPPORT (a format version this library cannot read, or the
 * other byte order), -ESPIPE (FD cannot be read at an offset), or the
 * -errno of pread(2).
 * Thread safety: any thread.
 */
int uffdwp_snapshot_read_info(int fd, struct uffdwp_snapshot_info *info,
			      struct uffdwp_region *regions, size_t max);

/*
 * uffdwp_snapshot_load - read one snapshot file from FD (sequentially from
 * its current offset: files, pipes and sockets alike) and write its pages
 * into memory: into DST[i] for the file's i-th region (in address order),
 * or, when DST is NULL and NR 0, at the addresses the file records (which
 * must be mapped and writable in the caller).  Apply a base first, then
 * its deltas in epoch order, passing the info of the previous file as
 * PREV (NULL for the base): a delta is refused unless it follows PREV in
 * the same session.  INFO (may be NULL) receives the file's header.
 * Returns 0 or:
 *   -EINVAL   bad arguments, or DST's count or a length differs from the
 *             file's regions;
 *   -EBADMSG  not a uffdwp snapshot, truncated or inconsistent, or
 *             (version 2) a checksum differs: a byte of the file was
 *             changed (found after the pages were read: memory may
 *             hold them);
 *   -EPROTONOSUPPORT  format version or byte order not readable here;
 *   -ESTALE   a delta without PREV, of another session, or not next after
 *             PREV;
 *   -EFAULT   a destination page is not mapped writable (or, at recorded
 *             addresses, lies where the loader's own buffers are);
 *   -ENOMEM, or the -errno of read(2).
 * Memory may have been partly written when an error comes after the
 * header.  Thread safety: any thread.
 */
int uffdwp_snapshot_load(int fd, const struct uffdwp_region *dst, size_t nr,
			 const struct uffdwp_snapshot_info *prev,
			 struct uffdwp_snapshot_info *info);

/* ------------------------------------------------------------------ */
/* Dirty tracker                                                       */
/* ------------------------------------------------------------------ */

enum uffdwp_backend {
	UFFDWP_BACKEND_AUTO = 0,	/* the best available, in this order: */
	UFFDWP_BACKEND_RING,		/* UFFD_FEATURE_WP_RING write log */
	UFFDWP_BACKEND_PAGEMAP_SCAN,	/* WP_ASYNC + PAGEMAP_SCAN */
	UFFDWP_BACKEND_SOFT_DIRTY,	/* clear_refs 4 + pagemap bit 55: clears
					 * the whole process's soft-dirty bits */
	UFFDWP_BACKEND_MPROTECT,	/* mprotect + SIGSEGV */
	UFFDWP_BACKEND_COUNT
};

/* "auto", "ring", "pagemap-scan", "soft-dirty", "mprotect"; NULL if B is
 * out of range.  Thread safety: any thread. */
const char *uffdwp_backend_name(enum uffdwp_backend b);
/* The backend named NAME (as above), or -EINVAL. */
int uffdwp_backend_from_name(const char *name);

/*
 * uffdwp_backend_available - 0 if backend B can work here, else the
 * -errno uffdwp_tracker_new() would return for it (-EOPNOTSUPP: the
 * kernel lacks it; -EBUSY: soft-dirty is already used by a tracker;
 * -EINVAL: bad B).  uffdwp_backend_choose() returns the backend AUTO
 * uses: the first the kernel has, even if busy (AUTO never falls back to
 * another one).  Thread safety: any thread.
 */
int uffdwp_backend_available(enum uffdwp_backend b);
enum uffdwp_backend uffdwp_backend_choose(void);

struct uffdwp_tracker;

/*
 * uffdwp_tracker_new - start tracking writes to NR regions (same rules as
 * for snapshots).  Every page counts as clean at this point.
 *
 * AUTO uses uffdwp_backend_choose()'s backend or fails with its error
 * (-EBUSY: a region is registered with another userfaultfd, say); it
 * never switches to another backend.  Every backend reports every page
 * written or discarded (MADV_DONTNEED...) since the last collect; see
 * uffdwp_tracker_new(3) for what each may report in excess, and for the
 * soft-dirty and mprotect backends' one miss (a discarded page read again
 * before the collect, on some kernels).
 *
 * Backend notes: soft-dirty clears the soft-dirty bits of the whole
 * process on every collect, so only one soft-dirty tracker may exist per
 * process; collect holds writers out of the regions (PROT_WRITE taken
 * away, writers wait in a SIGSEGV handler) for its read-and-clear.
 * mprotect installs the same SIGSEGV handler (faults it is not
 * responsible for are retried once, then go to the previous handler or
 * the default action) and takes PROT_WRITE away from the regions.  For
 * both, each region must be writable with one protection throughout
 * (restored when the tracker is freed), no two such trackers may share a
 * page, and a kernel write into a read-only tracked page (read(2) into it)
 * fails with EFAULT.  Memory backed by transparent hugepages may be
 * reported a whole 2 MiB extent at a time by the ring, PAGEMAP_SCAN and
 * soft-dirty backends.
 *
 * Returns 0 or:
 *   -EINVAL   bad arguments (as for snapshots) or bad BACKEND; a region
 *             PROT_NONE, read-only or of mixed kinds (every backend, as
 *             for snapshots); (soft-dirty, mprotect) a region whose pages
 *             have different protections;
 *   -EFAULT   part of a region is not mapped;
 *   -EDEADLK  (soft-dirty, mprotect) a region holds a thread's stack or
 *             the calling thread's thread-local storage, which their
 *             SIGSEGV handler needs writable;
 *   -EOPNOTSUPP  the backend (for AUTO: every backend) is unavailable on
 *             this kernel;
 *   -EBUSY    a soft-dirty tracker exists already / region registered;
 *             (soft-dirty, mprotect) a region overlaps another such
 *             tracker's;
 *   -ENOSPC   too many soft-dirty and mprotect trackers (limit 16);
 *   -ENOMEM, or what the kernel returned.
 * Thread safety: any thread.
 */
int uffdwp_tracker_new(struct uffdwp_tracker **out,
		       const struct uffdwp_region *regions, size_t nr,
		       enum uffdwp_backend backend);

/* The backend T uses.  Thread safety: any thread. */
enum uffdwp_backend uffdwp_tracker_backend(const struct uffdwp_tracker *t);

/*
 * uffdwp_tracker_collect - the pages written since the previous collect
 * (or since uffdwp_tracker_new()).
 *
 * Stores up to MAX page addresses, ascending, in PAGES and returns how many
 * it stored.  Pages that did not fit stay pending and come first in the
 * next call, so a return value equal to MAX means "call again".  Pages
 * are reported once per collect even if written many times.  Read the
 * pages' contents after the call: a write that lands during the call is
 * then either in what you read or reported by the next call.
 * Returns the count or -EINVAL (NULL T, NULL PAGES with MAX > 0),
 * -ECHILD (in a child of fork(): the copy is inert, and its free
 * releases only the child's copies), -ESTALE (soft-dirty, mprotect: the
 * program changed a region's protection, or unmapped or mapped over it;
 * every page of that region is reported from the next call on, and its
 * protection is left to the program: uffdwp_tracker_new(3)), or an
 * error from the kernel.
 * Thread safety: one collector at a time per tracker; writers may run.
 */
ssize_t uffdwp_tracker_collect(struct uffdwp_tracker *t, void **pages,
			       size_t max);

/*
 * uffdwp_tracker_collect_ranges (since 0.4) - uffdwp_tracker_collect()
 * with the pages as ranges: adjacent pending pages of a region coalesced
 * into one struct uffdwp_region, ascending, a range never spanning two
 * regions.  Stores up to MAX ranges and returns how many; the same rounds
 * as uffdwp_tracker_collect() (a return equal to MAX means "call again",
 * pages that did not fit come first in the next call, a write landing
 * during the call is in what is read after it or in the next result), and
 * the two may be mixed on one tracker.  Returns the count or -EINVAL (NULL
 * or dead T, NULL RANGES with MAX > 0, RANGES not writable: nothing is
 * taken then), -ECHILD, or an error from the kernel.
 * Thread safety: as uffdwp_tracker_collect().
 */
ssize_t uffdwp_tracker_collect_ranges(struct uffdwp_tracker *t,
				      struct uffdwp_region *ranges,
				      size_t max);

/* Stop tracking (unprotect, restore protections) and free.  NULL ignored.
 * Thread safety: once, when no other call on T runs; writers may run. */
void uffdwp_tracker_free(struct uffdwp_tracker *t);

#ifdef __cplusplus
}
#endif

#endif /* UFFDWP_H */
