/* SPDX-License-Identifier: MIT */
/*
 * kv_backend.c — backend-independent part of the backend interface
 * (kv_backend.h): destroying any backend through its ops table. Each
 * backend's create lives with its kernels (kernels/cpu/, kernels/cuda/).
 */
#include <stddef.h>

#include "kv_backend.h"

void kv_backend_destroy(kv_backend_t *b)
{
    if (!b || !b->ops)
        return;
    if (b->ops->destroy)
        b->ops->destroy(b->ctx);
    b->ops = NULL;
    b->ctx = NULL;
}
