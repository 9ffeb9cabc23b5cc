// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT
/* version.c: the library's version at run time (see uffdwp.h). */
#include <errno.h>

#include "internal.h"

int uffdwp_version(int *major, int *minor)
{
	if (!major || !minor)
		return -EINVAL;
	*major = UFFDWP_VERSION_MAJOR;
	*minor = UFFDWP_VERSION_MINOR;
	return 0;
}

bool uffdwp_version_at_least(int major, int minor)
{
	return UFFDWP_VERSION_MAJOR == major && UFFDWP_VERSION_MINOR >= minor;
}
