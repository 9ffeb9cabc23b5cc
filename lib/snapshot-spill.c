// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/*
 * snapshot-spill.c: where saved pages go when the side buffer is full.
 * The spill file is the sink itself when the sink is a regular file
 * written at known offsets (a page's bytes go where the stream puts them,
 * and the copier skips them), else a memfd (pages punched out as the
 * copier drains them).  Also the engine's I/O loop (uw_io_all()).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snapshot-parts.h"

/* The fd sink issues write(2)s of at most this much: on some kernels the
 * cost of one write(2) into tmpfs grows faster than its length (a 2 MiB
 * write took ~1.4 s in the riscv64 TCG guest, 128 x 16 KiB ~35 ms).  It
 * also matches pipe and socket buffers. */
#define SINK_WRITE_MAX	(16UL << 10)

/*
 * All of [P, P + LEN) written to FD (IO_WRITE: at its offset; IO_PWRITE:
 * at OFF) or read from it at OFF, in pieces of at most SINK_WRITE_MAX,
 * retried on EINTR.  0 or -errno; -ENOSPC when FD takes no more bytes,
 * -EIO when a read finds the end of the file (a page never spilled).
 */
int uw_io_all(int fd, char *p, size_t len, off_t off, enum uw_io op)
{
	while (len) {
		size_t piece = len < SINK_WRITE_MAX ? len : SINK_WRITE_MAX;
		ssize_t n = op == IO_WRITE ? write(fd, p, piece) :
			    op == IO_PWRITE ? pwrite(fd, p, piece, off) :
			    pread(fd, p, piece, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return op == IO_PREAD ? -EIO : -ENOSPC;
		p += n;
		off += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * Where spilled pages go.  A regular file sink without O_APPEND is written
 * at offsets from its current position, so a page can go straight to its
 * place in it; anything else spills to a memfd (kept by a session from one
 * snapshot to the next).
 */
int uw_snap_setup_spill(struct uffdwp_snapshot *s)
{
	int fd = s->opts.sink_fd, fl;
	struct stat sb;
	off_t pos;

	s->spill_bytes = 0;
	if (!s->opts.sink && !fstat(fd, &sb) && S_ISREG(sb.st_mode) &&
	    (fl = fcntl(fd, F_GETFL)) >= 0 && !(fl & O_APPEND) &&
	    (pos = lseek(fd, 0, SEEK_CUR)) >= 0) {
		s->sink_positional = true;
		s->spill_fd = fd;
		s->spill_base = pos;
		return 0;
	}
	s->sink_positional = false;
	s->spill_base = 0;
	if (s->memfd < 0)
		s->memfd = memfd_create("uffdwp-spill", MFD_CLOEXEC);
	else if (ftruncate(s->memfd, 0)) {
		/* Left-over pages are overwritten before they are read. */
	}
	if (s->memfd < 0)
		return -errno;
	s->spill_fd = s->memfd;
	return 0;
}
