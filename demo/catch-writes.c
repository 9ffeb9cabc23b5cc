// SPDX-License-Identifier: GPL-2.0
/*
 * catch-writes: userfaultfd write-protection, shown step by step.
 *
 * A buffer of PAGES pages is filled, registered with UFFDIO_REGISTER_MODE_WP
 * and write-protected.  A worker thread then writes a new value into every
 * page.  Each write stops in the kernel and arrives here as a message with
 * UFFD_PAGEFAULT_FLAG_WP; we print it, remember the old contents (as a
 * snapshot tool would), and resolve it with UFFDIO_WRITEPROTECT mode 0,
 * which lets the write go through.  At the end every page must hold the
 * worker's value and every saved copy the value from before the write.
 *
 * Exit status 0 when every write was caught exactly once and the data is
 * right, 1 otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGES 8

static char *buf;
static long psz;

static void *worker(void *arg)
{
	(void)arg;
	for (int i = 0; i < PAGES; i++) {
		/* Each store below blocks until the handler resolves it. */
		memset(buf + i * psz, 'A' + i, psz);
	}
	return NULL;
}

static int fail(const char *what)
{
	fprintf(stderr, "catch-writes: %s: %s\n", what, strerror(errno));
	return 1;
}

int main(void)
{
	struct uffdio_api api = { .api = UFFD_API,
				  .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP };
	struct uffdio_register reg = { 0 };
	struct uffdio_writeprotect wp = { 0 };
	static char saved[PAGES][64];
	int caught[PAGES] = { 0 };
	int uffd, bad = 0;
	pthread_t t;

	setvbuf(stdout, NULL, _IOLBF, 0);
	psz = sysconf(_SC_PAGESIZE);
	buf = mmap(NULL, PAGES * psz, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return fail("mmap");
	for (int i = 0; i < PAGES; i++)
		memset(buf + i * psz, 'a' + i, psz);

	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
	if (uffd < 0)
		return fail("userfaultfd");
	if (ioctl(uffd, UFFDIO_API, &api))
		return fail("UFFDIO_API with UFFD_FEATURE_PAGEFAULT_FLAG_WP");
	reg.range.start = (uintptr_t)buf;
	reg.range.len = PAGES * psz;
	reg.mode = UFFDIO_REGISTER_MODE_WP;
	if (ioctl(uffd, UFFDIO_REGISTER, &reg))
		return fail("UFFDIO_REGISTER_MODE_WP");
	wp.range = reg.range;
	wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
	if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp))
		return fail("UFFDIO_WRITEPROTECT");
	printf("write-protected %d pages at %p; starting a writer thread\n",
	       PAGES, (void *)buf);

	if (pthread_create(&t, NULL, worker, NULL))
		return fail("pthread_create");
	for (int n = 0; n < PAGES; n++) {
		struct pollfd p = { .fd = uffd, .events = POLLIN };
		struct uffd_msg msg;
		unsigned long addr;
		int idx;

		if (poll(&p, 1, 10000) != 1) {
			fprintf(stderr, "catch-writes: no fault within 10 s\n");
			return 1;
		}
		if (read(uffd, &msg, sizeof(msg)) != sizeof(msg))
			return fail("read uffd_msg");
		if (msg.event != UFFD_EVENT_PAGEFAULT ||
		    !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)) {
			fprintf(stderr, "catch-writes: unexpected event %u flags %llx\n",
				msg.event, (unsigned long long)msg.arg.pagefault.flags);
			return 1;
		}
		addr = msg.arg.pagefault.address & ~(psz - 1);
		idx = (addr - (uintptr_t)buf) / psz;
		if (idx < 0 || idx >= PAGES) {
			fprintf(stderr, "catch-writes: fault outside the buffer\n");
			return 1;
		}
		caught[idx]++;
		/* The page still holds its old contents: save them. */
		memcpy(saved[idx], buf + idx * psz, sizeof(saved[idx]));
		printf("caught write %d: page %d at %#lx, flags WP%s, old byte '%c'\n",
		       n + 1, idx, addr,
		       msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE ? "|WRITE" : "",
		       saved[idx][0]);
		wp.range.start = addr;
		wp.range.len = psz;
		wp.mode = 0;	/* unprotect and wake the writer */
		if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp))
			return fail("UFFDIO_WRITEPROTECT resolve");
	}
	pthread_join(t, NULL);

	for (int i = 0; i < PAGES; i++) {
		int ok = caught[i] == 1 && saved[i][0] == 'a' + i;

		for (long j = 0; j < psz; j++)
			ok &= buf[i * psz + j] == 'A' + i;
		if (!ok) {
			printf("page %d: caught %d times, saved '%c', now '%c': WRONG\n",
			       i, caught[i], saved[i][0], buf[i * psz]);
			bad = 1;
		}
	}
	printf("%s: %d writes caught, old contents saved, new contents verified\n",
	       bad ? "FAILED" : "OK", PAGES);
	return bad;
}
