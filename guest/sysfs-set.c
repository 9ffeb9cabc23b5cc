// SPDX-License-Identifier: GPL-2.0
/*
 * sysfs-set FILE VALUE [FILE VALUE]...: write each VALUE to its FILE (a
 * sysfs or procfs knob) and read it back.  Plan entries use it to change
 * the guest's settings between runs of the suites, e.g. THP "always".
 * Exits 1 naming the first file that could not be set.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 3 || argc % 2 == 0) {
		fprintf(stderr, "usage: sysfs-set FILE VALUE [FILE VALUE]...\n");
		return 2;
	}
	for (int i = 1; i < argc; i += 2) {
		const char *file = argv[i], *val = argv[i + 1];
		char back[256] = "";
		ssize_t n;
		int fd = open(file, O_WRONLY);

		if (fd < 0 || write(fd, val, strlen(val)) < 0) {
			fprintf(stderr, "sysfs-set: %s: %s\n", file, strerror(errno));
			return 1;
		}
		close(fd);
		fd = open(file, O_RDONLY);
		n = fd < 0 ? -1 : read(fd, back, sizeof(back) - 1);
		if (fd >= 0)
			close(fd);
		back[n > 0 ? n : 0] = 0;
		printf("%s: %s", file, back);
	}
	return 0;
}
