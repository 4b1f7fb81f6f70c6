/* Block-granular first-fit over address ranges that Python registers (lent, already mapped blocks).
 * Shared by both backends: the CUDA pluggable-allocator entry points allocate from it, so torch's
 * allocations (backward included, from any thread) land in lent blocks without calling into Python. */
#ifndef HARVEST_BLOCK_ARENA_H
#define HARVEST_BLOCK_ARENA_H

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

int harvest_arena_configure(uint64_t block_bytes);
int harvest_arena_add(uint64_t addr, uint64_t num_bytes);
int harvest_arena_remove(uint64_t addr, uint64_t num_bytes);
int harvest_arena_stats(uint64_t *range_bytes_out, uint64_t *used_bytes_out, uint64_t *num_live_out);
void *harvest_arena_alloc(ssize_t size);
int harvest_arena_free(void *ptr);

#ifdef __cplusplus
}
#endif

#endif
