#define _GNU_SOURCE
#include "bench_util.h"
#include "uffd_ring.h"
#include "uffd_util.h"
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static uint64_t now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
int main(void)
{
	long psz = sysconf(_SC_PAGESIZE);
	size_t npages = (1UL << 30) / psz, k = npages / 1000;
	char *region = mmap(NULL, npages * psz, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
	struct uring_view r = { .uffd = -1 };
	madvise(region, npages * psz, MADV_NOHUGEPAGE);
	memset(region, 1, npages * psz);
	if (ring_open(&r, npages / 4, 0)) { printf("ring_open failed\n"); return 1; }
	if (uffd_register(r.uffd, region, npages * psz, UFFDIO_REGISTER_MODE_WP, NULL) ||
	    uffd_wp(r.uffd, region, npages * psz, UFFDIO_WRITEPROTECT_MODE_WP)) { printf("reg failed\n"); return 1; }
	size_t stride = npages / k;
	for (int mode = 0; mode < 4; mode++) {
		const char *names[] = {"write+read+reset", "reset-already-protected", "empty-reset", "clustered"};
		for (int rep = 0; rep < 11; rep++) {
			uint64_t t0 = now(), t1, t2, t3, sum = 0;
			size_t n = mode == 2 ? 0 : k;
			for (size_t i = 0; i < n; i++) {
				size_t pg = mode == 3 ? (rep * 5000 + i) % npages : (i * stride + (rep * 7919 + i * 31) % stride) % npages;
				region[pg * psz + 64] = rep;
			}
			if (mode == 1)
				for (size_t i = 0; i < n; i++) {
					size_t pg = (i * stride + (rep * 7919 + i * 31) % stride) % npages;
					uffd_wp(r.uffd, region + pg * psz, psz, UFFDIO_WRITEPROTECT_MODE_WP);
				}
			t1 = now();
			uint64_t prod = ring_producer(&r), c0 = r.consumer;
			for (uint64_t i = r.consumer; i < prod; i++) sum += ring_entry(&r, i);
			t2 = now();
			if (ring_reset(&r, prod, 0, NULL)) { printf("reset failed\n"); return 1; }
			t3 = now();
			printf("micro,%s,rep=%d,entries=%llu,write_us=%.1f,read_us=%.1f,reset_us=%.1f,%llu\n", names[mode], rep,
			       (unsigned long long)(prod - c0) , (t1-t0)/1e3, (t2-t1)/1e3, (t3-t2)/1e3, (unsigned long long)(sum & 1));
		}
	}
	return 0;
}
