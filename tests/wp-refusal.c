// SPDX-License-Identifier: GPL-2.0
/*
 * wp-refusal: a kernel that has uffd-wp built in but whose page tables
 * cannot carry it on this boot (powerpc64 under the hash MMU, series patch
 * 54's pgtable_supports_uffd_wp()) refuses write-protection cleanly and
 * keeps the rest of userfaultfd working.
 *
 *  - the boot really is the one the lane means: /proc/cpuinfo says
 *    "MMU : Hash" (run with --expect-mmu NAME);
 *  - UFFDIO_API advertises none of the write-protect features (PAGEFAULT
 *    _FLAG_WP, WP_HUGETLBFS_SHMEM, WP_UNPOPULATED, WP_ASYNC, WP_RING) and
 *    no UFFDIO_SET_MODE ioctl, and asking for any of them is EINVAL;
 *  - UFFDIO_REGISTER with MODE_WP (alone or with MODE_MISSING) is EINVAL
 *    and leaves nothing registered;
 *  - a missing fault is still delivered and resolved with UFFDIO_COPY;
 *  - PAGEMAP_SCAN cannot write-protect (no vma is registered for it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tap.h"
#include "uffd_util.h"

#ifndef UFFD_FEATURE_WP_RING
#define UFFD_FEATURE_WP_RING	(1ULL << 30)
#endif

static const struct {
	uint64_t bit;
	const char *name;
} wp_features[] = {
	{ UFFD_FEATURE_PAGEFAULT_FLAG_WP, "pagefault-flag-wp" },
	{ UFFD_FEATURE_WP_HUGETLBFS_SHMEM, "wp-hugetlbfs-shmem" },
	{ UFFD_FEATURE_WP_UNPOPULATED, "wp-unpopulated" },
	{ UFFD_FEATURE_WP_ASYNC, "wp-async" },
	{ UFFD_FEATURE_WP_RING, "wp-ring" },
};

/* The "MMU" line of /proc/cpuinfo ("Hash", "Radix"), or "" if none. */
static void cpuinfo_mmu(char *out, size_t len)
{
	char line[256];
	FILE *f = fopen("/proc/cpuinfo", "r");

	out[0] = '\0';
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');

		if (strncmp(line, "MMU", 3) || !colon)
			continue;
		colon++;
		colon += strspn(colon, " \t");
		colon[strcspn(colon, "\n")] = '\0';
		snprintf(out, len, "%s", colon);
		break;
	}
	fclose(f);
}

/* A fresh userfaultfd's UFFDIO_API asking for FEATURES: 0 or -errno. */
static int raw_api(uint64_t features, struct uffdio_api *api)
{
	int fd = syscall(__NR_userfaultfd, O_CLOEXEC);

	if (fd < 0)
		return -errno;
	memset(api, 0, sizeof(*api));
	api->api = UFFD_API;
	api->features = features;
	if (ioctl(fd, UFFDIO_API, api)) {
		int err = -errno;

		close(fd);
		return err;
	}
	close(fd);
	return 0;
}

static void case_api(void)
{
	struct uffdio_api api;
	int ret = raw_api(0, &api);
	unsigned int i;

	if (ret) {
		tap_fail("api-handshake", "UFFDIO_API with no features: %s", strerror(-ret));
		return;
	}
	tap_pass("api-handshake");
	for (i = 0; i < sizeof(wp_features) / sizeof(wp_features[0]); i++) {
		char name[64];
		struct uffdio_api asked;

		snprintf(name, sizeof(name), "api-not-offered-%s", wp_features[i].name);
		tap_check(!(api.features & wp_features[i].bit), name,
			  "UFFDIO_API offers it (features %#llx)",
			  (unsigned long long)api.features);
		snprintf(name, sizeof(name), "api-refuses-%s", wp_features[i].name);
		ret = raw_api(wp_features[i].bit |
			      (wp_features[i].bit == UFFD_FEATURE_WP_RING ?
			       UFFD_FEATURE_WP_ASYNC : 0), &asked);
		tap_check(ret == -EINVAL, name, "asking for it gave %s, not EINVAL",
			  ret ? strerror(-ret) : "success");
	}
	tap_check(!(api.ioctls & (1ULL << 0x32)) && !(api.ioctls & (1ULL << 0x0A)),
		  "api-no-set-mode-ioctl", "ioctls %#llx include UFFDIO_SET_MODE",
		  (unsigned long long)api.ioctls);
}

static void case_register(void)
{
	size_t len = 4 * page_size();
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t modes[] = { UFFDIO_REGISTER_MODE_WP,
			     UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP };
	const char *names[] = { "register-wp-einval", "register-missing-wp-einval" };
	unsigned int i;
	int fd;

	if (p == MAP_FAILED)
		tap_bail("mmap: %s", strerror(errno));
	/* populated first: a registration that wrongly succeeds with
	 * MODE_MISSING must not leave the writes below waiting */
	memset(p, 1, len);
	fd = uffd_open(0, NULL);
	if (fd < 0)
		tap_bail("userfaultfd: %s", strerror(-fd));
	for (i = 0; i < 2; i++) {
		int ret = uffd_register(fd, p, len, modes[i], NULL);

		tap_check(ret == -EINVAL, names[i], "UFFDIO_REGISTER gave %s, not EINVAL",
			  ret ? strerror(-ret) : "success");
	}
	/* nothing was registered for WP: the range cannot be protected */
	tap_check(uffd_wp(fd, p, len, UFFDIO_WRITEPROTECT_MODE_WP) != 0,
		  "writeprotect-refused", "UFFDIO_WRITEPROTECT on the range succeeded");
	close(fd);
	munmap(p, len);
}

struct toucher {
	volatile char *p;
	char seen;
};

static void *touch(void *arg)
{
	struct toucher *t = arg;

	t->seen = t->p[0];
	return NULL;
}

static void case_missing_still_works(void)
{
	const char *name = "missing-fault-resolved";
	size_t ps = page_size();
	char *p = mmap(NULL, ps, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *src = malloc(ps);
	struct toucher t = { .seen = 0 };
	struct uffd_msg msg;
	pthread_t th;
	int fd, ret;

	if (p == MAP_FAILED || !src)
		tap_bail("allocation failed");
	memset(src, 0x7b, ps);
	fd = uffd_open(0, NULL);
	if (fd < 0 || uffd_register(fd, p, ps, UFFDIO_REGISTER_MODE_MISSING, NULL)) {
		tap_fail(name, "registering MODE_MISSING failed");
		return;
	}
	t.p = p;
	if (pthread_create(&th, NULL, touch, &t))
		tap_bail("pthread_create failed");
	ret = uffd_read_msg(fd, &msg, 5000);
	if (ret <= 0 || msg.event != UFFD_EVENT_PAGEFAULT) {
		tap_fail(name, "no missing-fault message within 5 s");
		/* let the reader go so the thread can be joined */
		uffd_copy(fd, p, src, ps, 0);
		pthread_join(th, NULL);
		close(fd);
		return;
	}
	ret = uffd_copy(fd, p, src, ps, 0);
	pthread_join(th, NULL);
	tap_check(ret == 0 && t.seen == 0x7b &&
		  !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP), name,
		  "copy %d, reader saw %#x, fault flags %#llx", ret, t.seen,
		  (unsigned long long)msg.arg.pagefault.flags);
	close(fd);
	munmap(p, ps);
	free(src);
}

static void case_pagemap_scan_cannot_protect(void)
{
#ifdef PAGEMAP_SCAN
	const char *name = "pagemap-scan-wp-refused";
	size_t len = 4 * page_size();
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct page_region regions[4];
	struct pm_scan_arg arg = {
		.size = sizeof(arg),
		.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
		.start = (unsigned long)p,
		.end = (unsigned long)p + len,
		.vec = (unsigned long)regions,
		.vec_len = 4,
		.category_mask = PAGE_IS_WRITTEN,
		.return_mask = PAGE_IS_WRITTEN,
	};
	int fd = open("/proc/self/pagemap", O_RDONLY);
	long ret;

	if (p == MAP_FAILED || fd < 0)
		tap_bail("setup failed: %s", strerror(errno));
	memset(p, 1, len);
	ret = ioctl(fd, PAGEMAP_SCAN, &arg);
	tap_check(ret < 0 && errno == EPERM, name,
		  "PAGEMAP_SCAN with WP_MATCHING gave %ld (%s), not EPERM", ret,
		  ret < 0 ? strerror(errno) : "success");
	close(fd);
	munmap(p, len);
#else
	tap_skip("pagemap-scan-wp-refused", "the uAPI headers have no PAGEMAP_SCAN");
#endif
}

int main(int argc, char **argv)
{
	const char *expect = NULL;
	char mmu[64];

	if (argc == 3 && !strcmp(argv[1], "--expect-mmu"))
		expect = argv[2];
	else if (argc != 1)
		tap_bail("usage: %s [--expect-mmu NAME]", argv[0]);
	watchdog(120);
	tap_plan(17 + (expect != NULL));
	cpuinfo_mmu(mmu, sizeof(mmu));
	if (expect)
		tap_check(!strcmp(mmu, expect), "boot-mmu",
			  "/proc/cpuinfo says MMU \"%s\", the lane expects \"%s\"", mmu, expect);
	tap_diag("MMU: %s", mmu[0] ? mmu : "(no MMU line)");
	case_api();
	case_register();
	case_missing_still_works();
	case_pagemap_scan_cannot_protect();
	return tap_done();
}
