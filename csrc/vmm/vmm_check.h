/* One checked call per syscall / driver call: a failure returns its code to Python, which raises an
 * exception naming the C entry point. No errno or driver state is kept between calls. */
#ifndef HARVEST_VMM_CHECK_H
#define HARVEST_VMM_CHECK_H

#include <errno.h>

/* For syscalls that return -1 and set errno. */
#define CHECK_SYS(call)                                   \
    do {                                                  \
        if ((call) == -1) return errno ? errno : EIO;     \
    } while (0)

#endif
