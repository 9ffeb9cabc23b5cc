// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/* probe.c: what the running kernel supports, asked once and cached. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static struct uffdwp_features cached;
static bool have_cached;

/*
 * Set when a probe step failed for want of a resource (descriptors or
 * memory) rather than for want of a feature: that result says nothing
 * about the kernel and is not cached (a process out of descriptors for
 * a moment would otherwise see -EOPNOTSUPP for the rest of its life).
 * The probe runs under PROBE_LOCK, so one flag will do.
 */
static int transient;	/* 0 or the first such -errno */

static void note(int err)
{
	if (!transient && (err == -EMFILE || err == -ENFILE ||
			   err == -ENOMEM || err == -EAGAIN ||
			   err == -ENOBUFS))
		transient = err;
}

static bool can_open(unsigned int flags, uint64_t *features)
{
	int fd = uffdwp_open(flags, 0, features);

	if (fd < 0) {
		note(fd);
		return false;
	}
	close(fd);
	return true;
}

/* /proc/self/pagemap, or -1 (noting a transient failure). */
static int open_pagemap(void)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		note(-errno);
	return fd;
}

static void *probe_alloc(size_t len)
{
	void *p = uw_alloc(len);

	if (!p)
		note(-ENOMEM);
	return p;
}

static bool probe_pagemap_scan(void)
{
	size_t psz = uw_page_size();
	struct page_region vec[1];
	struct pm_scan_arg arg = { .size = sizeof(arg) };
	char *p = probe_alloc(psz);
	int fd = open_pagemap();
	bool ok = false;

	if (p && fd >= 0) {
		p[0] = 1;
		arg.start = (uintptr_t)p;
		arg.end = (uintptr_t)p + psz;
		arg.vec = (uintptr_t)vec;
		arg.vec_len = 1;
		arg.category_mask = PAGE_IS_PRESENT;
		arg.return_mask = PAGE_IS_PRESENT;
		ok = ioctl(fd, PAGEMAP_SCAN, &arg) == 1;
	}
	if (fd >= 0)
		close(fd);
	uw_free(p, psz);
	return ok;
}

/* UFFDIO_SET_MODE with nothing to switch succeeds where it exists. */
static bool probe_set_mode(void)
{
	struct uffdio_set_mode m = { 0 };
	int fd = uffdwp_open(0, UFFD_FEATURE_WP_ASYNC, NULL);
	bool ok;

	if (fd < 0) {
		note(fd);
		return false;
	}
	ok = !uw_ioctl(fd, UFFDIO_SET_MODE, &m);
	close(fd);
	return ok;
}

static int pagemap_soft_dirty(int fd, void *addr)
{
	uint64_t e;
	off_t off = (off_t)((uintptr_t)addr / uw_page_size() * 8);

	if (pread(fd, &e, 8, off) != 8)
		return -1;
	return (e >> 55) & 1;
}

static bool probe_soft_dirty(void)
{
	size_t psz = uw_page_size();
	volatile char *p = probe_alloc(psz);
	int fd = open_pagemap();
	bool ok = false;

	/*
	 * A page just written is soft-dirty wherever the kernel tracks
	 * soft-dirty, and never is elsewhere: reading the bit tells, without
	 * clearing anybody's soft-dirty state (clear_refs acts on the whole
	 * process, and another user of it, such as CRIU's pre-dump, would
	 * lose its record).
	 */
	if (p && fd >= 0) {
		p[0] = 1;
		ok = pagemap_soft_dirty(fd, (void *)p) == 1;
	}
	if (fd >= 0)
		close(fd);
	uw_free((void *)p, psz);
	return ok;
}

static bool probe_thp(void)
{
	char buf[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");

	if (!f)
		return false;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return buf[0] && !strstr(buf, "[never]");
}

static void probe(struct uffdwp_features *f)
{
	uint64_t a = 0, b = 0;

	memset(f, 0, sizeof(*f));
	f->page_size = uw_page_size();
	f->device = can_open(UFFDWP_OPEN_NO_SYSCALL, &a);
	f->syscall = can_open(UFFDWP_OPEN_NO_DEVICE, &b);
	f->api_features = a | b;
	/* What a snapshot's default (kernel-mode faults) would get. */
	f->kernel_faults = can_open(UFFDWP_OPEN_KERNEL_FAULTS, NULL);
	f->wp = f->api_features & UFFD_FEATURE_PAGEFAULT_FLAG_WP;
	f->wp_unpopulated = f->wp &&
			    (f->api_features & UFFD_FEATURE_WP_UNPOPULATED);
	f->wp_async = f->wp && (f->api_features & UFFD_FEATURE_WP_ASYNC);
	f->pagemap_scan = probe_pagemap_scan();
	f->wp_ring = f->wp_async && (f->api_features & UFFD_FEATURE_WP_RING);
	f->set_mode = f->wp_async && probe_set_mode();
	/* Never clear the bits under a live soft-dirty tracker. */
	f->soft_dirty = uw_soft_dirty_in_use() ? cached.soft_dirty :
		       probe_soft_dirty();
	f->thp = probe_thp();
}

/* As uffdwp_probe_fresh(), returning 0 or the -errno (-EMFILE, -ENOMEM...)
 * that kept a step from telling. */
static int probe_fresh(struct uffdwp_features *f)
{
	struct uffdwp_features tmp;
	int err;

	pthread_mutex_lock(&probe_lock);
	transient = 0;
	probe(&tmp);
	err = transient;
	/* A result marred by a lack of descriptors or memory is returned
	 * but not kept: the next uffdwp_probe() asks again. */
	if (!transient) {
		cached = tmp;
		have_cached = true;
	}
	*f = tmp;
	pthread_mutex_unlock(&probe_lock);
	return err;
}

int uffdwp_probe_fresh(struct uffdwp_features *f)
{
	if (!f)
		return -EINVAL;
	probe_fresh(f);
	return 0;
}

int uw_probe(struct uffdwp_features *f)
{
	pthread_mutex_lock(&probe_lock);
	if (have_cached) {
		*f = cached;
		pthread_mutex_unlock(&probe_lock);
		return 0;
	}
	pthread_mutex_unlock(&probe_lock);
	return probe_fresh(f);
}

int uffdwp_probe(struct uffdwp_features *f)
{
	if (!f)
		return -EINVAL;
	uw_probe(f);
	return 0;
}

int uffdwp_feature_names(const struct uffdwp_features *f, char *buf,
			 size_t size)
{
	static const struct { size_t off; const char *name; } names[] = {
		{ offsetof(struct uffdwp_features, device), "device" },
		{ offsetof(struct uffdwp_features, syscall), "syscall" },
		{ offsetof(struct uffdwp_features, wp), "wp" },
		{ offsetof(struct uffdwp_features, wp_unpopulated), "wp-unpopulated" },
		{ offsetof(struct uffdwp_features, wp_async), "wp-async" },
		{ offsetof(struct uffdwp_features, pagemap_scan), "pagemap-scan" },
		{ offsetof(struct uffdwp_features, wp_ring), "wp-ring" },
		{ offsetof(struct uffdwp_features, soft_dirty), "soft-dirty" },
		{ offsetof(struct uffdwp_features, thp), "thp" },
		{ offsetof(struct uffdwp_features, set_mode), "set-mode" },
		{ offsetof(struct uffdwp_features, kernel_faults), "kernel-faults" },
	};
	size_t n = 0;

	if (!f || (!buf && size))
		return -EINVAL;
	if (size)
		buf[0] = 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (!*(const bool *)((const char *)f + names[i].off))
			continue;
		int k = snprintf(n < size ? buf + n : NULL,
				 n < size ? size - n : 0, "%s%s",
				 n ? " " : "", names[i].name);
		n += (size_t)k;
	}
	return (int)n;
}
