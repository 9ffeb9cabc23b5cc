// SPDX-License-Identifier: GPL-2.0
/*
 * kmemleak: at the end of the debug lane's plan, ask the kernel's leak
 * detector for a scan and fail when it reports any unreferenced object.
 * Prints each report so the console shows what leaked.  Exits 1 when the
 * kernel has no kmemleak (the debug lane must have it) or it reports.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#define KMEMLEAK "/sys/kernel/debug/kmemleak"

static int poke(const char *cmd)
{
	int fd = open(KMEMLEAK, O_WRONLY);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = write(fd, cmd, strlen(cmd));
	close(fd);
	return n < 0 ? -errno : 0;
}

int main(void)
{
	char buf[4096];
	long total = 0, reports = 0;
	int fd, err, i;
	ssize_t n;

	if (access(KMEMLEAK, F_OK))
		mount("debugfs", "/sys/kernel/debug", "debugfs", 0, NULL);
	/* Objects are reported once they are older than the minimum age
	 * (5 s) and unreferenced in a scan; two scans a few seconds apart
	 * make transient objects settle. */
	for (i = 0; i < 2; i++) {
		err = poke("scan");
		if (err) {
			printf("kmemleak: cannot scan (%s): %s\n", KMEMLEAK,
			       strerror(-err));
			return 1;
		}
		sleep(6);
	}
	fd = open(KMEMLEAK, O_RDONLY);
	if (fd < 0) {
		printf("kmemleak: %s: %s\n", KMEMLEAK, strerror(errno));
		return 1;
	}
	while ((n = read(fd, buf, sizeof(buf) - 1)) > 0) {
		char *p = buf;

		buf[n] = 0;
		total += n;
		while ((p = strstr(p, "unreferenced object"))) {
			reports++;
			p++;
		}
		fputs(buf, stdout);
	}
	close(fd);
	printf("kmemleak: %ld suspected leak(s) reported\n", reports);
	return reports || total ? 1 : 0;
}
