# The nested VM's image for the clients step (docs/clients.md), built on
# the host whatever the lane: every lane's guest runs Debian's QEMU for an
# x86 target (its own architecture's build of qemu-system-x86), so the image
# is the same x86 multiboot ELF for all of them.
#   make -f clients/clients.mk OUT=dir
OUT ?= build/clients
HOSTCC ?= gcc

NESTED_CFLAGS := -std=gnu11 -O2 -Wall -Wextra -Werror -ffreestanding -fno-pic \
	-fno-pie -no-pie -mno-red-zone -mgeneral-regs-only -fno-stack-protector \
	-fno-asynchronous-unwind-tables -nostdlib -static -Wl,--build-id=none \
	-Wl,-z,noexecstack -Wl,--no-warn-rwx-segments

all: $(OUT)/records-x86.elf

# QEMU's multiboot loader takes 32-bit ELF only: the 64-bit link is
# rewrapped as ELF32 (the entry is 32-bit code; the rest runs in long mode).
$(OUT)/records-x86.elf: clients/records-x86.c clients/records-x86.ld clients/clients.mk
	@mkdir -p $(dir $@)
	$(HOSTCC) $(NESTED_CFLAGS) -T clients/records-x86.ld -o $@.64 $<
	objcopy -O elf32-i386 $@.64 $@
	rm -f $@.64
