// SPDX-License-Identifier: GPL-2.0
/*
 * fuzz-uffd's operations: one function per kind of call, each drawing its
 * arguments from the main thread's stream (rnd()) and judging the result
 * against the model (fuzz/uffd-model.c).  The driver (fuzz/uffd.c) picks
 * them by weight.
 */
#define _GNU_SOURCE
#include "uffd.h"

/* ---- ops: userfaultfd() and UFFDIO_API --------------------------------- */

void op_api_garbage(void)
{
	int flags, fd, ret, e;
	bool bad_flags;
	struct uffdio_api api = { .api = UFFD_API };

	op_name = "api-garbage";
	flags = O_CLOEXEC | O_NONBLOCK;
	if (chance(30))
		flags |= UFFD_USER_MODE_ONLY;
	bad_flags = chance(20);
	if (bad_flags)
		flags |= 1 << rnd(31);
	if (bad_flags && !(flags & ~(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY)))
		bad_flags = false;
	fd = syscall(SYS_userfaultfd, flags);
	e = errno;
	judge("userfaultfd(flags)", fd < 0 ? -1 : 0, e, bad_flags,
	      ERR_UFFD_OPEN);
	if (fd < 0)
		return;
	switch (rnd(4)) {
	case 0:		/* garbage bits */
		api.features = rng_next(&rs);
		break;
	case 1:		/* wrong api */
		api.api = rnd(2) ? 0 : UFFD_API + 1 + rnd(1000);
		break;
	default:	/* a subset of what the kernel offers */
		api.features = rng_next(&rs) & kernel_features;
	}
	{
		uint64_t asked = api.features, api_v = api.api;
		bool bad = api_v != UFFD_API || (asked & ~kernel_features);

		ret = ioctl(fd, UFFDIO_API, &api);
		e = errno;
		judge("UFFDIO_API", ret, e, bad, ERR_API);
		if (ret == 0) {
			/* A second UFFDIO_API on the same fd must fail. */
			struct uffdio_api again = { .api = UFFD_API };

			ret = ioctl(fd, UFFDIO_API, &again);
			judge("second UFFDIO_API", ret, errno, true, ERR_API);
		}
	}
	close(fd);
}

void slot_close(struct slot *s)
{
	int fd = s->fd;

	if (fd < 0)
		return;
	main_wants_pool = 1;
	pthread_mutex_lock(&pool_lock);
	s->fd = -1;
	pthread_mutex_unlock(&pool_lock);
	main_wants_pool = 0;
	close(fd);
	if (s->ring)
		munmap(s->ring, s->ring_size);
	s->ring = NULL;
	s->ring_set = false;
	for (int i = 0; i < NREGIONS; i++)
		if (regions[i].state == RS_REG && regions[i].slot == s - slots)
			regions[i].state = RS_NONE;
	/* Partially registered regions may have been this fd's too; unknown
	 * stays unknown. */
}

static void ring_setup(struct slot *s, bool hostile);

void op_slot_reopen(void)
{
	struct slot *s = &slots[rnd(NSLOTS)];
	uint64_t f = UFFD_FEATURE_PAGEFAULT_FLAG_WP, got = 0;
	int fd, kind = rnd(10);

	op_name = "slot-reopen";
	slot_close(s);
	if (kind < 4)
		f |= UFFD_FEATURE_WP_ASYNC;
	else if (kind < 5)
		f = 0;
	if (chance(40))
		f |= UFFD_FEATURE_WP_UNPOPULATED;
	if (chance(30))
		f |= UFFD_FEATURE_EVENT_REMAP;
	if (chance(20))
		f |= UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP;
	if (chance(15))
		f |= UFFD_FEATURE_EVENT_FORK;
	if (!(f & UFFD_FEATURE_WP_ASYNC) && chance(15))
		f |= UFFD_FEATURE_SIGBUS;
	if (chance(20))
		f |= UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EXACT_ADDRESS;
	if (have_ring && (f & UFFD_FEATURE_WP_ASYNC) && chance(want_ring ? 80 : 40))
		f |= UFFD_FEATURE_WP_RING;
	f &= kernel_features;
	fd = uffd_open_flags(O_CLOEXEC | O_NONBLOCK |
			     (chance(30) ? UFFD_USER_MODE_ONLY : 0), f, &got);
	if (fd < 0) {
		judge("open pool uffd", -1, -fd, false,
		      ERR_UFFD_OPEN | ERR_API);
		if (f & UFFD_FEATURE_WP_RING)
			ring_open_err = -fd;
		return;
	}
	if (f & UFFD_FEATURE_WP_RING)
		ring_opens++;
	s->features = f;
	main_wants_pool = 1;
	pthread_mutex_lock(&pool_lock);
	s->fd = fd;
	pthread_mutex_unlock(&pool_lock);
	main_wants_pool = 0;
	if (f & UFFD_FEATURE_WP_RING)
		ring_setup(s, chance(20));
}

/* ---- ops: REGISTER / UNREGISTER ----------------------------------------- */

static void set_state_after(struct region *r, const struct range *g, int slot,
			    uint64_t mode, bool reg)
{
	if (!r)
		return;
	if (g->whole) {
		r->state = reg ? RS_REG : RS_NONE;
		r->slot = slot;
		r->mode = mode;
	} else {
		r->state = RS_UNKNOWN;
	}
}

void op_register(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	struct uffdio_register reg = { 0 };
	uint64_t mode;
	bool bad;
	int ret;

	op_name = "register";
	if (!s)
		return;
	mode = chance(70) ? UFFDIO_REGISTER_MODE_WP : 0;
	if (chance(30) || !mode)
		mode |= UFFDIO_REGISTER_MODE_MISSING;
	if (chance(5))
		mode = UFFDIO_REGISTER_MODE_MINOR;	/* anon: must fail */
	if (chance(3))
		mode = 1ULL << (3 + rnd(60));		/* unknown bit */
	if (chance(2))
		mode = 0;				/* no mode: EINVAL */
	bad = g.bad || g.hole || mode == 0 ||
	      (mode & ~(UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP));
	/* Another fd already owning the whole region: EBUSY. */
	if (r && g.whole && r->state == RS_REG && r->slot != s - slots)
		bad = true;
	reg.range.start = g.start;
	reg.range.len = g.len;
	reg.mode = mode;
	ret = ioctl(s->fd, UFFDIO_REGISTER, &reg);
	judge("UFFDIO_REGISTER", ret, errno, bad, ERR_REGISTER);
	if (ret == 0)
		set_state_after(r, &g, s - slots, mode, true);
	if (ret == 0 && r && !(mode & UFFDIO_REGISTER_MODE_WP))
		r->wp_dropped = true;
	else if (r && !g.bad && errno != EBUSY)
		r->state = RS_UNKNOWN;	/* e.g. ENOMEM midway */
}

void op_unregister(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	struct uffdio_range rg = { g.start, g.len };
	int ret;

	op_name = "unregister";
	if (!s)
		return;
	ret = ioctl(s->fd, UFFDIO_UNREGISTER, &rg);
	judge("UFFDIO_UNREGISTER", ret, errno, g.bad || g.hole,
	      ERR_UNREGISTER);
	/*
	 * UNREGISTER has no owner check: through any uffd of this mm it
	 * drops whatever registration covers the range (fs/userfaultfd.c
	 * userfaultfd_unregister() only skips unregistered VMAs).
	 */
	if (ret == 0 && r)
		set_state_after(r, &g, -1, 0, false);
}

/* ---- ops: WRITEPROTECT / COPY / ZEROPAGE / WAKE / CONTINUE ------------- */

void op_writeprotect(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	struct uffdio_writeprotect w = { { g.start, g.len }, 0 };
	bool bad = g.bad || g.hole, must_work;
	int ret;

	op_name = "writeprotect";
	if (!s)
		return;
	w.mode = chance(75) ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
	if (chance(20))
		w.mode |= UFFDIO_WRITEPROTECT_MODE_DONTWAKE;
	/* Protecting never wakes: WP|DONTWAKE is EINVAL. */
	if (w.mode == (UFFDIO_WRITEPROTECT_MODE_WP |
		       UFFDIO_WRITEPROTECT_MODE_DONTWAKE))
		bad = true;
	if (chance(3)) {
		w.mode |= 1ULL << (2 + rnd(60));
		bad = true;
	}
	must_work = !bad && r && g.valid && r->state == RS_REG &&
		    r->slot == s - slots && (r->mode & UFFDIO_REGISTER_MODE_WP);
	ret = ioctl(s->fd, UFFDIO_WRITEPROTECT, &w);
	judge("UFFDIO_WRITEPROTECT", ret, errno, bad, ERR_WRITEPROTECT);
	if (must_work && ret && errno != EAGAIN)
		failure(F_IOCTL, "UFFDIO_WRITEPROTECT of a WP-registered range "
			"failed: %s", strerror(errno));
	/* DONTWAKE unprotect may leave a sync writer waiting: wake it. */
	if (ret == 0 && (w.mode & UFFDIO_WRITEPROTECT_MODE_DONTWAKE))
		uffd_wake(s->fd, (void *)g.start, g.len);
}

void op_copy_zero(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	bool bad = g.bad || g.hole, zero = chance(40);
	char *copy_src = src_buf;
	int ret, e;
	int64_t done;

	op_name = zero ? "zeropage" : "copy";
	if (!s)
		return;
	if (!zero && g.len > SRC_PAGES * (uint64_t)psz && !bad)
		g.len = SRC_PAGES * psz;
	if (zero) {
		struct uffdio_zeropage z = { { g.start, g.len }, 0, 0 };

		if (chance(3)) {
			z.mode = 1ULL << (1 + rnd(62));
			bad = true;
		}
		ret = ioctl(s->fd, UFFDIO_ZEROPAGE, &z);
		e = errno;
		done = z.zeropage;
	} else {
		struct uffdio_copy c = { g.start, (uintptr_t)src_buf, g.len, 0, 0 };

		if (chance(30))
			c.mode |= UFFDIO_COPY_MODE_WP;
		if (chance(3)) {
			c.mode |= 1ULL << (2 + rnd(61));
			bad = true;
		}
		if (chance(3)) {	/* unaligned source: allowed */
			c.src += 8;
		} else if (chance(3)) {	/* unmapped source: EFAULT */
			c.src = 0x1000;
			bad = true;
		}
		copy_src = (char *)(uintptr_t)c.src;
		ret = ioctl(s->fd, UFFDIO_COPY, &c);
		e = errno;
		done = c.copy;
	}
	judge(zero ? "UFFDIO_ZEROPAGE" : "UFFDIO_COPY", ret, e, bad, ERR_MFILL);
	/* Pages filled (all, or the part before the error) changed word 0. */
	if (r && !bad && (ret == 0 || done > 0)) {
		uint64_t filled = ret == 0 ? g.len : (uint64_t)done;
		size_t first = (g.start - (uintptr_t)r->addr) / psz;

		for (size_t i = 0; i * psz < filled && first + i < r->npages; i++)
			r->shadow[first + i] =
				zero ? 0 : *(uint64_t *)(copy_src + i * psz);
	}
	if (ret && (e == EEXIST || e == EAGAIN) && !bad)
		uffd_wake(s->fd, (void *)g.start, g.len);
}

void op_wake_continue(void)
{
	struct region *r = pick_region();
	struct slot *s = pick_slot();
	struct range g = pick_range(r);
	int ret;

	op_name = "wake-continue";
	if (!s)
		return;
	if (chance(60)) {
		struct uffdio_range rg = { g.start, g.len };

		ret = ioctl(s->fd, UFFDIO_WAKE, &rg);
		judge("UFFDIO_WAKE", ret, errno, g.bad, ERR_WAKE);
	} else {
		/* Anonymous memory has no page cache: CONTINUE always fails. */
		struct uffdio_continue c = { { g.start, g.len }, 0, 0 };

		if (chance(30))
			c.mode = 1ULL << rnd(64);
		ret = ioctl(s->fd, UFFDIO_CONTINUE, &c);
		judge("UFFDIO_CONTINUE on anonymous memory", ret, errno, true,
		      ERR_CONTINUE);
	}
}

/* A uffd ioctl on something that is not a userfaultfd, or an unknown one. */
void op_wrong_fd(void)
{
	struct uffdio_range rg = { 0x10000, 4096 };
	struct slot *s = pick_slot();
	int ret;

	op_name = "wrong-fd";
	if (chance(50) || !s) {
		ret = ioctl(scan_fd, UFFDIO_WAKE, &rg);
		judge("UFFDIO_WAKE on pagemap fd", ret, errno, true,
		      ERR_WRONG_FD);
	} else {
		ret = ioctl(s->fd, _IOWR(UFFDIO, 0x20 + rnd(32), struct uffdio_range),
			    &rg);
		judge("unknown uffd ioctl", ret, errno, true,
		      ERR_UNKNOWN_IOCTL);
	}
}

/* ---- ops: PAGEMAP_SCAN -------------------------------------------------- */

void op_scan(void)
{
	struct region *r = pick_region();
	struct range g = pick_range(r);
	struct page_region vec[8];
	struct pm_scan_arg a = {
		.size = sizeof(a), .start = g.start, .end = g.start + g.len,
		.vec = (uintptr_t)vec, .vec_len = 8,
		.category_mask = PAGE_IS_WRITTEN, .return_mask = PAGE_IS_WRITTEN,
	};
	bool bad = false;
	long ret;

	op_name = "pagemap-scan";
	if (chance(40))
		a.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC;
	switch (rnd(12)) {
	case 0: a.size = rnd(2) ? 8 : sizeof(a) + 8; bad = true; break;
	case 1: a.flags |= 1ULL << (2 + rnd(62)); bad = true; break;
	case 2: a.return_mask = 1ULL << (8 + rnd(56)); bad = true; break;
	case 3: a.category_mask = 1ULL << (8 + rnd(56)); bad = true; break;
	case 4: a.vec = 0; bad = true; break;
	}
	/* Unaligned start or a wrapping end must fail; a kernel address
	 * (g.bad) fails on access_ok() or finds no VMA: errno only. */
	if ((g.start & (psz - 1)) || a.end < a.start)
		bad = true;
	ret = ioctl(scan_fd, PAGEMAP_SCAN, &a);
	judge("PAGEMAP_SCAN", ret < 0 ? -1 : 0, errno, bad, ERR_SCAN);
}

/* ---- ops: the write-log ring ------------------------------------------- */

static bool ring_sane(struct slot *s, const char *when)
{
	struct uffd_ring_header *h = s->ring;
	uint64_t p, c, n;

	if (!h)
		return true;
	checks[F_RING]++;
	p = __atomic_load_n(&h->producer, __ATOMIC_ACQUIRE);
	c = h->consumer;
	n = h->entries;
	if (n < 64 || (n & (n - 1)) || c > p ||
	    (p - c > n && !(h->flags & UFFD_RING_OVERFLOW)) ||
	    h->entry_offset < sizeof(*h) || h->entry_offset + n * 8 > s->ring_size) {
		failure(F_RING, "%s: header producer %" PRIu64 " consumer %"
			PRIu64 " entries %" PRIu64 " flags %#" PRIx64
			" entry_offset %" PRIu64 " (mapping %zu)", when, p, c, n,
			(uint64_t)h->flags, (uint64_t)h->entry_offset,
			s->ring_size);
		return false;
	}
	for (uint64_t i = c; i < p && i < c + n && i < c + 64; i++) {
		uint64_t e = ((uint64_t *)((char *)h + h->entry_offset))[i & (n - 1)];

		if (e & ~UFFD_RING_ENTRY_ADDR_MASK & ~UFFD_RING_ENTRY_HUGE) {
			failure(F_RING, "%s: entry %" PRIu64 " = %#" PRIx64
				" has unknown flag bits", when, i, e);
			return false;
		}
	}
	return true;
}

static void ring_setup(struct slot *s, bool hostile)
{
	struct uffdio_ring_setup rs_arg = { .entries = 64ULL << rnd(6) };
	bool bad = false;
	void *m;
	int ret;

	if (hostile) {
		switch (rnd(4)) {
		case 0: rs_arg.entries = rnd(2) ? 0 : 63 + rnd(2) * 2; break;
		case 1: rs_arg.entries = 1ULL << (23 + rnd(40)); break;
		case 2: rs_arg.flags = 1ULL << rnd(64); break;
		default: rs_arg.entries = 32; break;
		}
		bad = true;
	}
	ret = ioctl(s->fd, UFFDIO_RING_SETUP, &rs_arg);
	judge("UFFDIO_RING_SETUP", ret, errno, bad, ERR_RING_SETUP);
	if (ret && !bad)
		ring_setup_err = errno;
	if (ret)
		return;
	ring_setups++;
	s->ring_set = true;
	/* Hostile mappings first: writable, wrong size, wrong offset. */
	m = mmap(NULL, rs_arg.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED,
		 s->fd, 0);
	judge("ring mmap PROT_WRITE", m == MAP_FAILED ? -1 : 0, errno, true,
	      ERR_RING_MMAP);
	if (m != MAP_FAILED)
		munmap(m, rs_arg.mmap_size);
	m = mmap(NULL, rs_arg.mmap_size + psz, PROT_READ, MAP_SHARED, s->fd, 0);
	judge("ring mmap too large", m == MAP_FAILED ? -1 : 0, errno, true,
	      ERR_RING_MMAP);
	if (m != MAP_FAILED)
		munmap(m, rs_arg.mmap_size + psz);
	m = mmap(NULL, rs_arg.mmap_size, PROT_READ, MAP_SHARED, s->fd, psz);
	judge("ring mmap offset", m == MAP_FAILED ? -1 : 0, errno, true,
	      ERR_RING_MMAP);
	if (m != MAP_FAILED)
		munmap(m, rs_arg.mmap_size);
	m = mmap(NULL, rs_arg.mmap_size, PROT_READ, MAP_SHARED, s->fd, 0);
	judge("ring mmap", m == MAP_FAILED ? -1 : 0, errno, false,
	      ERR_RING_MMAP);
	if (m == MAP_FAILED) {
		failure(F_RING, "valid ring mmap of %" PRIu64 " bytes failed: %s",
			(uint64_t)rs_arg.mmap_size, strerror(errno));
		return;
	}
	s->ring = m;
	s->ring_size = rs_arg.mmap_size;
	ring_sane(s, "after setup");
	/* A second setup must fail (EBUSY). */
	ret = ioctl(s->fd, UFFDIO_RING_SETUP, &rs_arg);
	judge("second UFFDIO_RING_SETUP", ret, errno, true,
	      ERR_RING_SETUP);
}

void op_ring(void)
{
	struct slot *s = pick_slot();
	struct uffdio_ring_reset rr = { 0 };
	uint64_t p, c;
	bool bad = false;
	int ret;

	op_name = "ring";
	if (!s)
		return;
	if (!(s->features & UFFD_FEATURE_WP_RING)) {
		/* Setup on a fd without the feature must fail. */
		struct uffdio_ring_setup a = { .entries = 64 };

		ret = ioctl(s->fd, UFFDIO_RING_SETUP, &a);
		judge("UFFDIO_RING_SETUP without WP_RING", ret, errno, true,
		      ERR_RING_SETUP);
		return;
	}
	if (!s->ring) {
		rr.consumer = 0;
		ret = ioctl(s->fd, UFFDIO_RING_RESET, &rr);
		judge("UFFDIO_RING_RESET (no ring mapped)", ret, errno,
		      !s->ring_set, ERR_RING_RESET);
		return;
	}
	if (!ring_sane(s, "before reset"))
		return;
	p = __atomic_load_n(&s->ring->producer, __ATOMIC_ACQUIRE);
	c = s->ring->consumer;
	rr.consumer = p;
	/* the overflow count before the flag: it is published after it */
	rr.overflows = __atomic_load_n(&s->ring->overflows, __ATOMIC_ACQUIRE);
	if (__atomic_load_n(&s->ring->flags, __ATOMIC_ACQUIRE) &
	    UFFD_RING_OVERFLOW)
		rr.flags = UFFDIO_RING_RESET_CLEAR_OVERFLOW;
	switch (rnd(7)) {
	case 0: rr.consumer = p + 1 + rnd(1000); bad = true; break;
	case 1: if (c) { rr.consumer = c - 1; bad = true; } break;
	case 2: rr.flags |= 1ULL << (2 + rnd(62)); bad = true; break;
	case 3: rr.consumer = c + (p > c ? rnd(p - c) : 0); break;
	/* Leaves the pages writable: their next writes go unlogged. */
	case 4: rr.flags |= UFFDIO_RING_RESET_DISCARD; break;
	}
	ret = ioctl(s->fd, UFFDIO_RING_RESET, &rr);
	/* The producer may have moved on: p + 1 can become valid. */
	judge("UFFDIO_RING_RESET", ret, errno,
	      bad && !(rr.consumer > p &&
		       rr.consumer <= __atomic_load_n(&s->ring->producer,
						      __ATOMIC_ACQUIRE)),
	      ERR_RING_RESET);
	if (ret == 0 && !bad &&
	    (rr.reprotected > rr.consumer - c ||
	     ((rr.flags & UFFDIO_RING_RESET_DISCARD) && rr.reprotected)))
		failure(F_RING, "RING_RESET %" PRIu64 " -> %" PRIu64
			" flags %#" PRIx64 " reprotected %" PRIu64 " entries",
			c, (uint64_t)rr.consumer, (uint64_t)rr.flags,
			(uint64_t)rr.reprotected);
	ring_sane(s, "after reset");
}

void op_write(void)
{
	struct region *r = pick_region();
	size_t i;
	uint64_t val, back = 0, pm;
	char *page;
	int sig;

	op_name = "write";
	if (!r)
		return;
	i = rnd(r->npages);
	page = r->addr + i * psz;
	val = (op_index << 8) | 0x5a;
	check_word(r, i, "before write");
	sig = safe_access((uint64_t *)page, true, val, &back);
	checks[F_SIGBUS]++;
	if (sig) {
		if (sig != SIGBUS || !pool_has_sigbus())
			failure(F_SIGBUS, "write to page %zu of %p: signal %d "
				"(state %d, sigbus fd in pool: %d)", i, r->addr,
				sig, r->state, pool_has_sigbus());
		check_word(r, i, "after SIGBUS");
		return;
	}
	r->shadow[i] = val;
	checks[F_READBACK]++;
	if (back != val)
		failure(F_READBACK, "write of %#" PRIx64 " to page %zu of %p "
			"read back %#" PRIx64, val, i, r->addr, back);
	pm = pagemap_entry(page);
	checks[F_WPCLEAR]++;
	if (pm & PM_UFFD_WP)
		failure(F_WPCLEAR, "page %zu of %p still has the uffd-wp bit "
			"after a write returned (state %d slot %d mode %#" PRIx64
			", pagemap %#" PRIx64 ")%s", i, r->addr, r->state, r->slot,
			r->mode, pm, r->wp_dropped ? " -- the region was "
			"registered without MODE_WP before (known: see race/"
			"lifetime-reregister-without-wp-clears-bits)" :
			" -- NEW: no registration without MODE_WP seen");
	/* Async tracking: PAGEMAP_SCAN must call the page written. */
	if (r->state == RS_REG && (r->mode & UFFDIO_REGISTER_MODE_WP) &&
	    (slots[r->slot].features & UFFD_FEATURE_WP_ASYNC) && chance(25)) {
		struct page_region v[2];
		struct pm_scan_arg a = {
			.size = sizeof(a), .start = (uintptr_t)page,
			.end = (uintptr_t)page + psz, .vec = (uintptr_t)v,
			.vec_len = 2, .category_mask = PAGE_IS_WRITTEN,
			.return_mask = PAGE_IS_WRITTEN,
		};
		long n = ioctl(scan_fd, PAGEMAP_SCAN, &a);

		checks[F_WPCLEAR]++;
		if (n != 1 || v[0].start != (uintptr_t)page)
			failure(F_WPCLEAR, "PAGEMAP_SCAN does not report the "
				"written async page %zu of %p (returned %ld, %s)",
				i, r->addr, n, n < 0 ? strerror(errno) : "-");
	}
}

void op_read(void)
{
	struct region *r = pick_region();

	op_name = "read";
	if (r)
		check_word(r, rnd(r->npages), "read");
}

void op_remap_region(void)
{
	struct region *r = &regions[rnd(NREGIONS)];

	op_name = "munmap-mmap:wrlock";
	pthread_rwlock_wrlock(&map_lock);
	op_name = "munmap-mmap";
	if (r->addr && chance(30) && r->npages > 8) {
		/* Cut the tail off (and the guard with it). */
		size_t keep = r->npages / 2;

		op_name = "munmap-tail";
		munmap(r->addr + keep * psz, (r->npages - keep + r->guard) * psz);
		r->npages = keep;
		r->guard = 0;
	} else {
		region_drop(r);
		region_new(r);
	}
	pthread_rwlock_unlock(&map_lock);
}

void op_mremap(void)
{
	struct region *r = pick_region();
	size_t newn;
	uint64_t *sh;
	char *p;

	op_name = "mremap";
	if (!r)
		return;
	newn = chance(50) ? r->npages : r->npages + rnd(8);
	sh = realloc(r->shadow, newn * sizeof(uint64_t));
	if (!sh)
		return;
	for (size_t i = r->npages; i < newn; i++)
		sh[i] = 0;
	r->shadow = sh;
	pthread_rwlock_wrlock(&map_lock);
	p = mremap(r->addr, r->npages * psz, newn * psz, MREMAP_MAYMOVE);
	if (p != MAP_FAILED) {
		if (p != r->addr && r->guard)
			munmap(r->addr + r->npages * psz, r->guard * psz);
		if (p != r->addr)
			r->guard = 0;
		r->addr = p;
		r->npages = newn;
		/* Without EVENT_REMAP the moved range is no longer registered. */
		if (r->state == RS_REG &&
		    !(slots[r->slot].features & UFFD_FEATURE_EVENT_REMAP))
			r->state = RS_NONE;
		else if (newn != r->npages || r->state == RS_REG)
			r->state = RS_UNKNOWN;
	}
	pthread_rwlock_unlock(&map_lock);
}

void op_madvise(void)
{
	struct region *r = pick_region();
	size_t a, n;
	int adv, ret;

	op_name = "madvise";
	if (!r)
		return;
	a = rnd(r->npages);
	n = 1 + rnd(r->npages - a);
	/*
	 * No MADV_FREE: a lazyfree page's content is undefined (old or zero)
	 * until it is written again, and reclaim may drop it at any later
	 * time, which word 0's exact shadow cannot follow; tests/ring-paths.c
	 * covers what MADV_FREE does to protected pages.
	 */
	switch (rnd(20)) {
	case 0: case 1: case 2: case 3: case 4: case 5:
		adv = MADV_DONTNEED;
		op_name = "madv-dontneed";
		/* Whole huge regions too: zap_huge_pmd() of a PMD-mapped THP. */
		if (r->npages == 512 && chance(50)) {
			a = 0;
			n = 512;
		}
		break;
	case 6: case 7:
		adv = MADV_PAGEOUT;
		op_name = "madv-pageout";
		if (n > 32)
			n = 32;
		break;
	case 8:
		adv = MADV_COLLAPSE;
		op_name = "madv-collapse";
		if (r->npages < 512)
			return;
		a = 0;
		n = 512;
		break;
	case 9: case 10: case 11:
		adv = MADV_NOHUGEPAGE;
		break;
	default:
		adv = MADV_HUGEPAGE;
		a = 0;
		n = r->npages;
	}
	ret = madvise(r->addr + a * psz, n * psz, adv);
	if (ret && adv != MADV_COLLAPSE)
		judge("madvise", -1, errno, false, ERR_MADVISE);
	if (ret == 0 && adv == MADV_DONTNEED)
		for (size_t i = a; i < a + n; i++)
			r->shadow[i] = 0;
}

/* The child: its copy of word 0 matches the parent's, its writes stick.
 * The first mismatch is described on FD for the parent to report. */
static int child_run(uint64_t cseed, int fd)
{
	int bad = 0;
	uint64_t cs = cseed;
	char msg[256];

	for (int k = 0; k < 8; k++) {
		struct region *r = &regions[rng_next(&cs) % NREGIONS];
		size_t i;
		uint64_t v = 0, nv = 0xc0de0000ULL + k;
		char *page;
		int sig;

		if (!r->addr)
			continue;
		i = rng_next(&cs) % r->npages;
		page = r->addr + i * psz;
		sig = safe_access((uint64_t *)page, false, 0, &v);
		if (!sig && v != r->shadow[i] && !bad++)
			snprintf(msg, sizeof(msg), "child read %#" PRIx64 " at "
				 "page %zu of %p (%zu pages, state %d slot %d), "
				 "parent's word %#" PRIx64 ", child pagemap %#"
				 PRIx64, v, i, r->addr, r->npages, r->state,
				 r->slot, r->shadow[i], pagemap_entry(page));
		sig = safe_access((uint64_t *)page, true, nv, &v);
		if (!sig)
			r->shadow[i] = v;	/* the child's copy now */
		if (((sig && sig != SIGBUS) || (!sig && v != nv)) && !bad++)
			snprintf(msg, sizeof(msg), "child write of %#" PRIx64
				 " to page %zu of %p: signal %d, read back %#"
				 PRIx64, nv, i, r->addr, sig, v);
	}
	if (bad && write(fd, msg, strlen(msg)) < 0)
		bad++;
	/* The inherited fds act on the parent's mm; waking is harmless. */
	for (int i = 0; i < NSLOTS; i++)
		if (slots[i].fd >= 0 && regions[0].addr)
			uffd_wake(slots[i].fd, regions[0].addr, psz);
	if (rng_next(&cs) & 1)
		for (int i = 0; i < NREGIONS; i++)
			if (regions[i].addr)
				madvise(regions[i].addr, regions[i].npages * psz,
					MADV_DONTNEED);
	return bad > 100 ? 100 : bad;
}

void op_fork(void)
{
	uint64_t cseed = rng_next(&rs);
	char msg[260] = "";
	long long end;
	int status, pfd[2];
	pid_t pid;

	op_name = "fork";
	if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK))
		return;
	pid = fork();
	if (pid == 0) {
		alarm(0);
		_exit(child_run(cseed, pfd[1]));
	}
	close(pfd[1]);
	checks[F_FORK]++;
	if (pid < 0) {
		if (errno != EAGAIN && errno != ENOMEM)
			failure(F_FORK, "fork: %s", strerror(errno));
		close(pfd[0]);
		return;
	}
	for (end = now_ms() + CHILD_WAIT_MS; now_ms() < end;) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
		usleep(1000);
	}
	if (now_ms() >= end && waitpid(pid, &status, WNOHANG) != pid) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		failure(F_FORK, "child %d did not exit within %d ms", pid,
			CHILD_WAIT_MS);
		close(pfd[0]);
		return;
	}
	if (read(pfd[0], msg, sizeof(msg) - 1) < 0)
		msg[0] = 0;
	close(pfd[0]);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		failure(F_FORK, "child %d: %s %d: %s", pid,
			WIFEXITED(status) ? "exit" : "signal",
			WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
			msg);
}
