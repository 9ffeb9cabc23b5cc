// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * incremental-checkpoint: checkpoint a buffer as a base file and then
 * small delta files, while a thread keeps changing it; rebuild it from
 * the files.
 *
 *   cc incremental-checkpoint.c $(pkg-config --cflags --libs uffdwp) \
 *      -o incremental-checkpoint
 *
 * A writer thread stamps pages of a 4 MiB buffer with a generation number,
 * a few pages per generation, round-robin.  Each checkpoint is taken
 * between two generations (the writer waits while it starts), and the
 * program keeps what the buffer held at each instant to check against.
 * The first checkpoint is a base, the next ones deltas holding only the
 * pages written since the one before.  At the end the base and the deltas
 * are loaded, in order, into a fresh buffer, which must equal the buffer
 * at the last instant.  Exit 0 when it does.
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

#define NPAGES		1024
#define PER_GEN		8	/* pages the writer stamps per generation */
#define CHECKPOINTS	4

static char *buf;
static size_t psz;
static atomic_int stop, generation;
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;

static void *writer(void *arg)
{
	size_t next = 0;

	(void)arg;
	while (!atomic_load(&stop)) {
		pthread_mutex_lock(&gate);	/* held while a checkpoint starts */
		int g = atomic_fetch_add(&generation, 1) + 1;

		for (int i = 0; i < PER_GEN; i++, next = (next + 1) % NPAGES)
			memcpy(buf + next * psz, &g, sizeof(g));
		pthread_mutex_unlock(&gate);
		usleep(1000);
	}
	return NULL;
}

int main(void)
{
	size_t len;
	struct uffdwp_region r;
	struct uffdwp_session *ss;
	struct uffdwp_snapshot_stats st;
	struct uffdwp_snapshot_info prev, info;
	char *at_instant, *rebuilt;
	int fds[CHECKPOINTS], err = 0;
	pthread_t th;

	psz = (size_t)sysconf(_SC_PAGESIZE);
	len = NPAGES * psz;
	buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	rebuilt = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	at_instant = malloc(len);
	if (buf == MAP_FAILED || rebuilt == MAP_FAILED || !at_instant)
		return 1;
	memset(buf, 0, len);
	r = (struct uffdwp_region){ buf, len };
	err = uffdwp_session_new(&ss, &r, 1, NULL);
	if (err) {
		fprintf(stderr, "uffdwp_session_new: %s\n", strerror(-err));
		return 1;
	}
	pthread_create(&th, NULL, writer, NULL);
	for (int c = 0; c < CHECKPOINTS && !err; c++) {
		char path[] = "/tmp/checkpoint-XXXXXX";

		usleep(20000);
		fds[c] = mkstemp(path);
		if (fds[c] < 0)
			return 1;
		unlink(path);
		/* The instant: between two generations of the writer. */
		pthread_mutex_lock(&gate);
		memcpy(at_instant, buf, len);
		err = uffdwp_session_snapshot(ss, fds[c], 0);
		pthread_mutex_unlock(&gate);
		if (!err)
			err = uffdwp_session_wait(ss, -1);	/* the writer runs */
		if (!err)
			err = uffdwp_session_stats(ss, &st);
		if (!err)
			printf("checkpoint %d: %s of %llu pages, pause %.1f us\n", c,
			       c ? "delta" : "base", (unsigned long long)st.pages,
			       st.pause_ns / 1000.0);
	}
	atomic_store(&stop, 1);
	pthread_join(th, NULL);
	uffdwp_session_free(ss);
	if (err) {
		fprintf(stderr, "checkpoint: %s\n", strerror(-err));
		return 1;
	}

	/* Rebuild: the base, then each delta in order. */
	for (int c = 0; c < CHECKPOINTS && !err; c++) {
		struct uffdwp_region dst = { rebuilt, len };

		lseek(fds[c], 0, SEEK_SET);
		err = uffdwp_snapshot_load(fds[c], &dst, 1, c ? &prev : NULL,
					   &info);
		prev = info;
		close(fds[c]);
	}
	if (err) {
		fprintf(stderr, "uffdwp_snapshot_load: %s\n", strerror(-err));
		return 1;
	}
	if (memcmp(rebuilt, at_instant, len)) {
		printf("FAILED: the rebuilt buffer differs from the last checkpoint's instant\n");
		return 1;
	}
	printf("rebuilt from a base and %d deltas: the buffer at the last checkpoint's instant\n",
	       CHECKPOINTS - 1);
	return 0;
}
