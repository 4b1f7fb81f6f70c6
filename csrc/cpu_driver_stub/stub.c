/* libcuda.so.1 stand-in for hosts without an NVIDIA driver.
 *
 * sgl_kernel's extension modules link libcuda.so.1 directly, so on a CPU-only host `import sgl_kernel`
 * (and with it SGLang) fails before any code runs. Every driver entry point those modules leave
 * undefined is defined here and reports CUDA_ERROR_NO_DEVICE, so they load and torch sees no GPU.
 * harvest loads this library only after failing to load a real driver.
 * symbols.inc is generated at set-up by gen_symbols.py from the installed sgl_kernel.
 */
#define CUDA_ERROR_NO_DEVICE 100

/* x86-64 and aarch64 calling conventions let a no-argument definition stand in for any signature
 * whose result is an int-sized status code, which every cu* entry point returns. */
#define STUB(name) int name(void) { return CUDA_ERROR_NO_DEVICE; }
#include "symbols.inc"

/* Marks this library as the stand-in: once its folder is on LD_LIBRARY_PATH (which harvest sets for the
 * SGLang subprocesses, and which children inherit), loading "libcuda.so.1" finds it, and only this symbol
 * tells it from a real driver. */
int harvest_cpu_driver_stub(void) { return 1; }
