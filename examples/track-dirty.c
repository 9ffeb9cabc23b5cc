// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * track-dirty: find the pages of a buffer written since the last look, the
 * way an incremental checkpoint or a live-migration pre-copy round does.
 *
 *   cc track-dirty.c $(pkg-config --cflags --libs uffdwp) -o track-dirty
 *
 * Writes every 7th page of a 1 MiB buffer, asks libuffdwp which pages were
 * written, and checks that the answer is exactly those pages.  Exit 0 when
 * it is.
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uffdwp.h>

int main(void)
{
	size_t psz = (size_t)sysconf(_SC_PAGESIZE), npages = 256;
	char *buf = mmap(NULL, npages * psz, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdwp_region r = { buf, npages * psz };
	struct uffdwp_tracker *t;
	void *pages[256];
	ssize_t n;
	int err;

	if (buf == MAP_FAILED)
		return 1;
	memset(buf, 0, npages * psz);		/* populate: all clean now */
	err = uffdwp_tracker_new(&t, &r, 1, UFFDWP_BACKEND_AUTO);
	if (err) {
		fprintf(stderr, "uffdwp_tracker_new: %s\n", strerror(-err));
		return 1;
	}
	printf("backend: %s\n", uffdwp_backend_name(uffdwp_tracker_backend(t)));

	for (size_t i = 0; i < npages; i += 7)
		buf[i * psz + 42] = 1;

	n = uffdwp_tracker_collect(t, pages, 256);
	printf("%zd pages written\n", n);
	for (ssize_t k = 0; k < n; k++)
		if (pages[k] != buf + (size_t)k * 7 * psz)
			n = -1;
	uffdwp_tracker_free(t);
	if (n != (ssize_t)((npages + 6) / 7)) {
		fprintf(stderr, "wrong set of written pages\n");
		return 1;
	}
	printf("ok: exactly the pages written\n");
	return 0;
}
