/* SPDX-License-Identifier: GPL-2.0 */
/*
 * wp_probe.h: the setup and the write-and-resolve round trip that the
 * conformance suites share: a userfaultfd registered (and maybe
 * write-protecting) a range, a private anonymous test area with its
 * expected contents, and one write checked to go through exactly one
 * uffd-wp fault.
 *
 * Failures come back as a return value plus a one-line reason in the
 * caller's WHY buffer (WLEN bytes); nothing here prints.
 */
#ifndef UFFDWP_TESTS_WP_PROBE_H
#define UFFDWP_TESTS_WP_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How long a probe waits for the fault message and for the writer, and how
 * long it then watches for a message that should not come. */
#define WP_PROBE_WAIT_MS	3000
#define WP_PROBE_QUIET_MS	300

/*
 * Open a userfaultfd asking for FEATURES (every one must be granted),
 * register [addr, addr + len) with MODE and, if PROTECT, write-protect the
 * whole range.  Returns the uffd, or -errno with WHY naming the step that
 * failed (-EOPNOTSUPP if a feature was not granted); the uffd is closed
 * then.
 */
int wp_uffd_open(void *addr, size_t len, uint64_t features, uint64_t mode,
		 bool protect, char *why, size_t wlen);

/* Private anonymous test memory, the bytes it should hold, and a uffd. */
struct wp_area {
	char *p;
	size_t len;
	char *expect;		/* what [p, p + len) should hold */
	int uffd;		/* negative until wp_area_arm() succeeds */
	bool leak;		/* a writer may still touch P: never unmap */
};

/*
 * Map LEN bytes of private anonymous memory at A->p, with A->expect all
 * zero (like the untouched pages).  Returns 0, or -errno with WHY.  A can
 * be given to wp_area_destroy() either way.
 */
int wp_area_create(struct wp_area *a, size_t len, char *why, size_t wlen);
/* Fill all of A with fill_pattern(SEED) and expect exactly that. */
void wp_area_fill(struct wp_area *a, unsigned int seed);
/*
 * wp_uffd_open() on all of A with FEATURES in MODE_WP, write-protecting it
 * if PROTECT; the uffd goes to A->uffd.  Returns 0, or -errno with WHY.
 */
int wp_area_arm(struct wp_area *a, uint64_t features, bool protect,
		char *why, size_t wlen);
/* Close the uffd, free EXPECT and unmap the area unless it is leaked. */
void wp_area_destroy(struct wp_area *a);
/* Write VAL to byte 0 of page IDX of A (A->expect follows) through exactly
 * one uffd-wp fault at that page, resolved by unprotecting it
 * (wp_write_faults_once()).  True if so, else false with WHY. */
bool wp_area_fault_page(struct wp_area *a, int idx, char val, char *why,
			size_t wlen);
/* True if A holds A->expect; else false, WHY naming the first bad byte. */
bool wp_area_data_ok(const struct wp_area *a, char *why, size_t wlen);

/*
 * Store VAL at ADDR from a writer thread and check that the store goes
 * through exactly one uffd-wp fault: within WP_PROBE_WAIT_MS one message
 * arrives, a PAGEFAULT with FLAG_WP and FLAG_WRITE at WANT, while the
 * writer is still blocked; unprotecting [res, res + res_len) (mode 0, which
 * wakes) lets the writer finish within WP_PROBE_WAIT_MS; and no further
 * message follows within WP_PROBE_QUIET_MS.
 *
 * Returns true if all of that holds, else false with WHY saying what was
 * wrong.  A writer still blocked after the resolution is let go by
 * unregistering and waking [res, res + res_len); if even that does not
 * free it, *STUCK is set (never cleared) and the memory at ADDR must not be
 * unmapped, since the thread may still store there.
 */
bool wp_write_faults_once(int uffd, char *addr, char val, const void *want,
			  char *res, size_t res_len, bool *stuck, char *why,
			  size_t wlen);

/*
 * Store VAL at ADDR from a writer thread and check that it needs no uffd
 * message: the store completes within WP_PROBE_WAIT_MS and no message is
 * readable on UFFD within WP_PROBE_QUIET_MS after it.
 *
 * Returns true if so, else false with WHY.  A blocked writer is let go by
 * unregistering and waking the (base) page of ADDR; if even that does not
 * free it, *STUCK is set as for wp_write_faults_once().
 */
bool wp_write_no_fault(int uffd, char *addr, char val, bool *stuck,
		       char *why, size_t wlen);

#endif
