// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot-to-file: save a consistent copy of a buffer to a file while
 * another thread keeps changing it, without fork().
 *
 *   cc snapshot-to-file.c $(pkg-config --cflags --libs uffdwp) -o snapshot-to-file
 *
 * A writer thread stamps every page of a 4 MiB buffer with a generation
 * number, over and over.  The snapshot is taken between two generations
 * (the writer waits while it starts), so every page of the file must hold
 * that one generation, whatever the writer did afterwards.  Exit 0 when
 * the file is consistent.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uffdwp.h>

#define NPAGES 1024

static char *buf;
static size_t psz;
static atomic_int stop, generation;
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;

static void *writer(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		pthread_mutex_lock(&gate);	/* held while the snapshot starts */
		int g = atomic_fetch_add(&generation, 1) + 1;

		for (size_t i = 0; i < NPAGES; i++)
			memcpy(buf + i * psz, &g, sizeof(g));
		pthread_mutex_unlock(&gate);
	}
	return NULL;
}

int main(void)
{
	char path[] = "/tmp/snapshot-XXXXXX";
	struct uffdwp_snapshot_opts o = { .sink_fd = -1 };
	struct uffdwp_region r;
	struct uffdwp_snapshot *s;
	pthread_t th;
	int fd, err, g0, bad = 0;

	psz = (size_t)sysconf(_SC_PAGESIZE);
	buf = mmap(NULL, NPAGES * psz, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	fd = mkstemp(path);
	if (buf == MAP_FAILED || fd < 0)
		return 1;
	unlink(path);
	memset(buf, 0, NPAGES * psz);
	r = (struct uffdwp_region){ buf, NPAGES * psz };
	o.sink_fd = fd;
	pthread_create(&th, NULL, writer, NULL);
	usleep(20000);

	/* The snapshot instant: between two generations of the writer. */
	pthread_mutex_lock(&gate);
	g0 = atomic_load(&generation);
	err = uffdwp_snapshot_start(&s, &r, 1, &o);
	pthread_mutex_unlock(&gate);
	if (err) {
		fprintf(stderr, "uffdwp_snapshot_start: %s\n", strerror(-err));
		return 1;
	}
	err = uffdwp_snapshot_wait(s, -1);	/* the writer runs meanwhile */
	uffdwp_snapshot_free(s);
	atomic_store(&stop, 1);
	pthread_join(th, NULL);
	if (err) {
		fprintf(stderr, "snapshot: %s\n", strerror(-err));
		return 1;
	}
	for (size_t i = 0; i < NPAGES; i++) {
		int v = -1;

		if (pread(fd, &v, sizeof(v), (off_t)(i * psz)) != sizeof(v) ||
		    v != g0)
			bad++;
	}
	printf("snapshot of generation %d; the writer reached %d; %d pages wrong\n",
	       g0, atomic_load(&generation), bad);
	return bad ? 1 : 0;
}
