// SPDX-License-Identifier: GPL-2.0
/*
 * records-x86.c: the nested VM of the clients step (docs/clients.md).
 *
 * A freestanding x86 program loaded by QEMU's multiboot loader (`-kernel`):
 * a 32-bit entry builds identity page tables for the first GiB, enters long
 * mode and calls records_main(), which fills the RAM above the image with
 * 256-byte versioned records and rewrites them for ever, in the scheme of
 * workload/workload.h (`uffdwp demo`): writer w owns records k*NW + w and
 * writes its update s to its record (s - 1) % R as seq_begin = s, 29
 * payload words derived from (record, s), seq_end = s.  The writers take
 * turns on the one vCPU; each starts its sweep at its own offset, so the
 * four write heads are spread across the RAM.
 *
 * The VM has one vCPU and checks itself between two updates, so a RAM that
 * belongs to the instant of its CPU state holds, for every writer at update
 * M, exactly the last update <= M in every record: nothing may be torn or
 * newer or older.  A snapshot that mixed two instants (a page saved after
 * the VM wrote it, or a write lost) is found record by record.
 *
 * Serial port (COM1) protocol, one line per answer:
 *   -> "@ready records=R writers=NW arena=BYTES base=ADDR"   after the fill
 *   <- 'V'  -> "@verify ok records=R updates=U"
 *              or "@verify bad=N first=G want=S got=B/E word=I"
 *   <- 'S'  -> "@status updates=U"
 * U counts the updates since the fill (it is in RAM too, so a restored VM
 * continues from the snapshot's count).
 */
#include <stdbool.h>
#include <stdint.h>

#define NW		4
#define WORDS		29
#define MB_MAGIC	0x1BADB002u
#define MB_FLAGS	0x00000002u	/* give us the memory size */
#define COM1		0x3F8

/* The multiboot header, then the 32-bit entry: page tables, long mode. */
__asm__(
	".section .multiboot, \"a\"\n"
	".align 4\n"
	".long 0x1BADB002\n"
	".long 0x00000002\n"
	".long -(0x1BADB002 + 0x00000002)\n"

	".section .text32, \"ax\"\n"
	".code32\n"
	".globl _start\n"
	"_start:\n"
	"	cli\n"
	"	movl %ebx, mb_info\n"
	"	movl $boot_stack_top, %esp\n"
	/* Clear the three tables (4 KiB each, contiguous). */
	"	movl $page_tables, %edi\n"
	"	xorl %eax, %eax\n"
	"	movl $(3 * 1024), %ecx\n"
	"	rep stosl\n"
	"	movl $(page_tables + 4096 + 3), %eax\n"
	"	movl %eax, page_tables\n"
	"	movl $(page_tables + 8192 + 3), %eax\n"
	"	movl %eax, page_tables + 4096\n"
	/* 512 entries of 2 MiB: present, writable, huge. */
	"	movl $(page_tables + 8192), %edi\n"
	"	movl $0x83, %eax\n"
	"	movl $512, %ecx\n"
	"1:	movl %eax, (%edi)\n"
	"	movl $0, 4(%edi)\n"
	"	addl $0x200000, %eax\n"
	"	addl $8, %edi\n"
	"	loop 1b\n"
	"	movl %cr4, %eax\n"
	"	orl $0x20, %eax\n"		/* PAE */
	"	movl %eax, %cr4\n"
	"	movl $page_tables, %eax\n"
	"	movl %eax, %cr3\n"
	"	movl $0xC0000080, %ecx\n"	/* EFER */
	"	rdmsr\n"
	"	orl $0x100, %eax\n"		/* LME */
	"	wrmsr\n"
	"	movl %cr0, %eax\n"
	"	orl $0x80000001, %eax\n"	/* PG, PE */
	"	movl %eax, %cr0\n"
	"	lgdt gdt_ptr\n"
	"	ljmp $0x08, $long_entry\n"

	".code64\n"
	"long_entry:\n"
	"	movw $0x10, %ax\n"
	"	movw %ax, %ds\n"
	"	movw %ax, %es\n"
	"	movw %ax, %ss\n"
	"	movw %ax, %fs\n"
	"	movw %ax, %gs\n"
	"	movq $boot_stack_top, %rsp\n"
	"	call records_main\n"
	"2:	hlt\n"
	"	jmp 2b\n"

	".section .rodata\n"
	".align 16\n"
	"gdt:\n"
	"	.quad 0\n"
	"	.quad 0x00209A0000000000\n"	/* 0x08: 64-bit code */
	"	.quad 0x0000920000000000\n"	/* 0x10: data */
	"gdt_ptr:\n"
	"	.word 3 * 8 - 1\n"
	"	.long gdt\n"
	".text\n");

uint32_t mb_info;
/* PML4, PDPT and PD, in this order (the entry clears all three at once). */
uint8_t page_tables[3 * 4096] __attribute__((aligned(4096)));
uint8_t boot_stack[16384] __attribute__((aligned(16)));
__asm__(".globl boot_stack_top\n.set boot_stack_top, boot_stack + 16384\n");

extern char _end[];

struct rec {
	uint64_t seq_begin;
	uint32_t writer, idx;
	uint64_t payload[WORDS];
	uint64_t seq_end;
};
_Static_assert(sizeof(struct rec) == 256, "record size");

static struct rec *arena;
static uint64_t nrec, per_writer[NW], done[NW];
static volatile uint64_t updates;

static inline void outb(uint16_t port, uint8_t v)
{
	__asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port));
}

static inline uint8_t inb(uint16_t port)
{
	uint8_t v;

	__asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}

static void putc_serial(char c)
{
	while (!(inb(COM1 + 5) & 0x20))
		;
	outb(COM1, (uint8_t)c);
}

static void puts_serial(const char *s)
{
	while (*s)
		putc_serial(*s++);
}

static void put_u64(uint64_t v)
{
	char buf[24];
	int i = 0;

	do {
		buf[i++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (i)
		putc_serial(buf[--i]);
}

static void put_hex(uint64_t v)
{
	puts_serial("0x");
	for (int sh = 60; sh >= 0; sh -= 4)
		putc_serial("0123456789abcdef"[(v >> sh) & 15]);
}

/* The payload word i of record g at update s (workload.h's wl_word). */
static inline uint64_t word(uint64_t g, uint64_t s, int i)
{
	uint64_t x = (g << 32 | (uint64_t)i) ^ (s * 0x9E3779B97F4A7C15ull);

	x ^= x >> 29;
	return x * 0xBF58476D1CE4E5B9ull;
}

static inline struct rec *rec_of(uint32_t w, uint64_t k)
{
	return &arena[k * NW + w];
}

/* Writer w's update s, in the order the workload writes it. */
static void update(uint32_t w, uint64_t s)
{
	uint64_t k = (s - 1) % per_writer[w], g = k * NW + w;
	struct rec *r = &arena[g];

	__atomic_store_n(&r->seq_begin, s, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	for (int i = 0; i < WORDS; i++)
		__atomic_store_n(&r->payload[i], word(g, s, i), __ATOMIC_RELAXED);
	__atomic_store_n(&r->seq_end, s, __ATOMIC_RELEASE);
}

/* The last update <= m that went to record k of a writer with r records. */
static inline uint64_t expected(uint64_t m, uint64_t k, uint64_t r)
{
	return m - (m - (k + 1)) % r;
}

/* Fill every record as writer w's update history up to done[w] left it. */
static void fill(void)
{
	for (uint32_t w = 0; w < NW; w++) {
		uint64_t r = per_writer[w];

		done[w] = r + (uint64_t)w * (r / NW);
		for (uint64_t k = 0; k < r; k++) {
			struct rec *p = rec_of(w, k);

			p->writer = w;
			p->idx = (uint32_t)k;
			update(w, expected(done[w], k, r));
		}
	}
}

static void verify(void)
{
	uint64_t bad = 0, first = 0, want = 0, gb = 0, ge = 0;
	int fword = -1;

	for (uint32_t w = 0; w < NW; w++) {
		uint64_t r = per_writer[w], m = done[w];

		for (uint64_t k = 0; k < r; k++) {
			uint64_t g = k * NW + w, e = expected(m, k, r);
			const struct rec *p = &arena[g];
			int badword = -1;
			bool ok = p->writer == w && p->idx == k &&
				  p->seq_begin == e && p->seq_end == e;

			for (int i = 0; ok && i < WORDS; i++)
				if (p->payload[i] != word(g, e, i)) {
					ok = false;
					badword = i;
				}
			if (ok)
				continue;
			if (!bad++) {
				first = g;
				want = e;
				gb = p->seq_begin;
				ge = p->seq_end;
				fword = badword;
			}
		}
	}
	if (!bad) {
		puts_serial("@verify ok records=");
		put_u64(nrec);
		puts_serial(" updates=");
		put_u64(updates);
		puts_serial("\n");
		return;
	}
	puts_serial("@verify bad=");
	put_u64(bad);
	puts_serial(" first=");
	put_u64(first);
	puts_serial(" want=");
	put_u64(want);
	puts_serial(" got=");
	put_u64(gb);
	puts_serial("/");
	put_u64(ge);
	puts_serial(" word=");
	if (fword < 0)
		puts_serial("-");
	else
		put_u64((uint64_t)fword);
	puts_serial("\n");
}

static void command(void)
{
	char c;

	if (!(inb(COM1 + 5) & 1))
		return;
	c = (char)inb(COM1);
	if (c == 'V') {
		verify();
	} else if (c == 'S') {
		puts_serial("@status updates=");
		put_u64(updates);
		puts_serial("\n");
	}
}

void records_main(void);
void records_main(void)
{
	const uint32_t *mbi = (const uint32_t *)(uintptr_t)mb_info;
	uint64_t ram_end, base, top;

	/* 115200 8N1, FIFO on: QEMU ignores the rate, a real UART would not. */
	outb(COM1 + 1, 0);
	outb(COM1 + 3, 0x80);
	outb(COM1, 1);
	outb(COM1 + 1, 0);
	outb(COM1 + 3, 3);
	outb(COM1 + 2, 0xC7);
	outb(COM1 + 4, 3);
	if (!(mbi[0] & 1)) {
		puts_serial("@error no memory size from the loader\n");
		return;
	}
	/* mem_upper: KiB above 1 MiB.  Keep the top MiB (firmware tables)
	 * and stay below the 1 GiB the page tables map. */
	ram_end = 0x100000 + (uint64_t)mbi[2] * 1024;
	if (ram_end > (1ull << 30))
		ram_end = 1ull << 30;
	base = ((uint64_t)(uintptr_t)_end + 0x1FFFFF) & ~0x1FFFFFull;
	top = (ram_end - 0x100000) & ~0xFFFull;
	if (top <= base + 2 * NW * sizeof(struct rec)) {
		puts_serial("@error too little memory\n");
		return;
	}
	arena = (struct rec *)(uintptr_t)base;
	nrec = (top - base) / sizeof(struct rec);
	for (uint32_t w = 0; w < NW; w++)
		per_writer[w] = (nrec - w + NW - 1) / NW;
	fill();
	puts_serial("@ready records=");
	put_u64(nrec);
	puts_serial(" writers=4 arena=");
	put_u64(nrec * sizeof(struct rec));
	puts_serial(" base=");
	put_hex(base);
	puts_serial("\n");
	for (;;) {
		for (uint32_t w = 0; w < NW; w++) {
			update(w, ++done[w]);
			updates++;
		}
		if (!(updates & 255))
			command();
	}
}
