/* Host backend: physical blocks are pages of one memfd; a "map" places a block's pages at a fixed
 * address inside a PROT_NONE reservation (MAP_SHARED|MAP_FIXED), an "unmap" puts PROT_NONE back, so
 * a stray access to an unmapped range faults instead of touching whatever is mapped elsewhere. */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmm_check.h"

static const int reserve_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

int hv_reserve(uint64_t num_bytes, uint64_t *addr_out) {
    void *addr = mmap(NULL, num_bytes, PROT_NONE, reserve_flags, -1, 0);
    if (addr == MAP_FAILED) return errno;
    *addr_out = (uint64_t)(uintptr_t)addr;
    return 0;
}

int hv_release(uint64_t addr, uint64_t num_bytes) {
    CHECK_SYS(munmap((void *)(uintptr_t)addr, num_bytes));
    return 0;
}

int hv_create(uint64_t num_bytes, int64_t *handle_out) {
    int fd = memfd_create("harvest_vmm", MFD_CLOEXEC);
    CHECK_SYS(fd);
    if (ftruncate(fd, (off_t)num_bytes) == -1) {
        int err = errno;
        close(fd);
        return err;
    }
    *handle_out = fd;
    return 0;
}

int hv_destroy(int64_t handle) {
    CHECK_SYS(close((int)handle));
    return 0;
}

int hv_unmap(uint64_t addr, uint64_t num_bytes) {
    void *got = mmap((void *)(uintptr_t)addr, num_bytes, PROT_NONE, reserve_flags | MAP_FIXED, -1, 0);
    if (got == MAP_FAILED) return errno;
    return 0;
}

/* Maps block offsets[i] of the memfd at addr + i * block_bytes; on failure the mapped prefix is
 * returned to PROT_NONE so the range is all-or-nothing. */
int hv_map_blocks(uint64_t addr, uint64_t block_bytes, int64_t handle, const uint64_t *offsets, int64_t num_blocks) {
    for (int64_t i = 0; i < num_blocks; i++) {
        void *at = (void *)(uintptr_t)(addr + (uint64_t)i * block_bytes);
        void *got = mmap(at, block_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, (int)handle,
                         (off_t)offsets[i]);
        if (got == MAP_FAILED) {
            int err = errno;
            if (i) hv_unmap(addr, (uint64_t)i * block_bytes);
            return err;
        }
    }
    return 0;
}

/* Unmaps one block at each of addrs[0..num_blocks) (a chunk's blocks, one per K/V buffer). */
int hv_unmap_blocks(const uint64_t *addrs, int64_t num_blocks, uint64_t block_bytes) {
    for (int64_t i = 0; i < num_blocks; i++) {
        int err = hv_unmap(addrs[i], block_bytes);
        if (err) return err;
    }
    return 0;
}

/* Maps block offsets[i] of the memfd at addrs[i]; on failure the blocks mapped so far go back to PROT_NONE. */
int hv_map_blocks_at(const uint64_t *addrs, uint64_t block_bytes, int64_t handle, const uint64_t *offsets,
                     int64_t num_blocks) {
    for (int64_t i = 0; i < num_blocks; i++) {
        int err = hv_map_blocks(addrs[i], block_bytes, handle, &offsets[i], 1);
        if (err) {
            for (int64_t j = 0; j < i; j++) hv_unmap(addrs[j], block_bytes);
            return err;
        }
    }
    return 0;
}

/* Zeroes a mapped range by dropping its memfd pages (MADV_REMOVE): the next access reads fresh zero pages.
 * Costs page-table work, not a memset of the range. */
int hv_zero(uint64_t addr, uint64_t num_bytes) {
    CHECK_SYS(madvise((void *)(uintptr_t)addr, num_bytes, MADV_REMOVE));
    return 0;
}

int hv_page_bytes(uint64_t *out) {
    long page = sysconf(_SC_PAGESIZE);
    CHECK_SYS(page);
    *out = (uint64_t)page;
    return 0;
}
