/* SPDX-License-Identifier: LGPL-2.1-or-later OR MIT */
/*
 * uapi_compat.h: the uAPI pieces libuffdwp needs that older installed
 * headers lack (WP_UNPOPULATED 6.4, WP_ASYNC and PAGEMAP_SCAN 6.7, the
 * write-log ring not merged yet).  Values are the kernel's; each is only
 * defined when the headers do not define it, and whether the running
 * kernel supports it is always probed at run time.
 */
#ifndef UFFDWP_UAPI_COMPAT_H
#define UFFDWP_UAPI_COMPAT_H

#include <linux/fs.h>
#include <linux/ioctl.h>
#include <linux/types.h>
#include <linux/userfaultfd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC		0xAA
#define USERFAULTFD_IOC_NEW	_IO(USERFAULTFD_IOC, 0x00)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED	(1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC		(1 << 15)
#endif

/* PAGEMAP_SCAN (fs/proc/task_mmu.c). */
#ifndef PAGEMAP_SCAN
#define PAGEMAP_SCAN	_IOWR('f', 16, struct pm_scan_arg)
#define PAGE_IS_WPALLOWED	(1 << 0)
#define PAGE_IS_WRITTEN		(1 << 1)
#define PAGE_IS_FILE		(1 << 2)
#define PAGE_IS_PRESENT		(1 << 3)
#define PAGE_IS_SWAPPED		(1 << 4)
#define PAGE_IS_PFNZERO		(1 << 5)
#define PAGE_IS_HUGE		(1 << 6)
#define PAGE_IS_SOFT_DIRTY	(1 << 7)
struct page_region {
	__u64 start;
	__u64 end;
	__u64 categories;
};
#define PM_SCAN_WP_MATCHING	(1 << 0)
#define PM_SCAN_CHECK_WPASYNC	(1 << 1)
struct pm_scan_arg {
	__u64 size;
	__u64 flags;
	__u64 start;
	__u64 end;
	__u64 walk_end;
	__u64 vec;
	__u64 vec_len;
	__u64 max_pages;
	__u64 category_inverted;
	__u64 category_mask;
	__u64 category_anyof_mask;
	__u64 return_mask;
};
#endif

/* Write-log ring (docs: shared ring-uapi.md; being added to the kernel). */
#ifndef UFFD_FEATURE_WP_RING
#define UFFD_FEATURE_WP_RING	(1 << 30)
#define _UFFDIO_RING_SETUP	(0x30)
#define _UFFDIO_RING_RESET	(0x31)
struct uffdio_ring_setup {
	__u64 entries;
	__u64 flags;
	__u64 mmap_size;
};
struct uffd_ring_header {
	__u64 producer;
	__u64 __reserved[15];
	__u64 consumer;
	__u64 entries;
	__u64 flags;
	__u64 entry_offset;
	__u64 overflows;
};
#define UFFD_RING_OVERFLOW	(1ULL << 0)
#define UFFD_RING_ENTRY_HUGE	(1ULL << 0)
struct uffdio_ring_reset {
	__u64 consumer;
	__u64 flags;
	__u64 reprotected;
	__u64 overflows;
};
#define UFFDIO_RING_RESET_CLEAR_OVERFLOW (1ULL << 0)
#define UFFDIO_RING_SETUP _IOWR(UFFDIO, _UFFDIO_RING_SETUP, struct uffdio_ring_setup)
#define UFFDIO_RING_RESET _IOWR(UFFDIO, _UFFDIO_RING_RESET, struct uffdio_ring_reset)
#endif

/* Added to the ring's uAPI after the rest: a kernel without it says EINVAL. */
#ifndef UFFDIO_RING_RESET_DISCARD
#define UFFDIO_RING_RESET_DISCARD (1ULL << 1)
#endif

/* Switching WP between sync and async on a live context (kernel/patches
 * "userfaultfd: add UFFDIO_SET_MODE ..."); a kernel without it says
 * EINVAL. */
#ifndef UFFDIO_SET_MODE
#define _UFFDIO_SET_MODE	(0x32)
struct uffdio_set_mode {
	__u64 enable;
	__u64 disable;
};
#define UFFDIO_SET_MODE _IOW(UFFDIO, _UFFDIO_SET_MODE, struct uffdio_set_mode)
#endif

/* Not part of the kernel's uAPI: entries keep flags below the page size. */
#ifndef UFFD_RING_ENTRY_ADDR_MASK
#define UFFD_RING_ENTRY_ADDR_MASK (~0xfffULL)
#endif

/* PROCMAP_QUERY (6.11): the VMA at or after an address, from an fd of
 * /proc/<pid>/maps; a kernel without it says ENOTTY. */
#ifndef PROCMAP_QUERY
struct procmap_query {
	__u64 size;
	__u64 query_flags;
	__u64 query_addr;
	__u64 vma_start;
	__u64 vma_end;
	__u64 vma_flags;
	__u64 vma_page_size;
	__u64 vma_offset;
	__u64 inode;
	__u32 dev_major;
	__u32 dev_minor;
	__u32 vma_name_size;
	__u32 build_id_size;
	__u64 vma_name_addr;
	__u64 build_id_addr;
};
#define PROCMAP_QUERY	_IOWR('f', 17, struct procmap_query)
#define PROCMAP_QUERY_VMA_READABLE		0x01
#define PROCMAP_QUERY_VMA_WRITABLE		0x02
#define PROCMAP_QUERY_VMA_EXECUTABLE		0x04
#define PROCMAP_QUERY_VMA_SHARED		0x08
#define PROCMAP_QUERY_COVERING_OR_NEXT_VMA	0x10
#endif

#endif
