/* SPDX-License-Identifier: MIT */
/*
 * kv_backend_convert.c — running a conversion (kv_backend.h,
 * "conversions"), a merge or a KVzip scoring on a backend: the backend's op
 * when its ops table lists one, else the CPU reference kernels
 * (kernels/cpu/kv_cpu_convert.c, kv_cpu_score.c), which need no context. So the page table converts through whatever backend the store
 * runs, and a backend without conversion ops (or none at all: unit tests
 * of the page table pass NULL) still works. No state.
 */
#include <stddef.h>

#include "kernels/cpu/kv_cpu_convert.h"
#include "kernels/cpu/kv_cpu_score.h"
#include "kv_backend.h"

int kv_backend_convert(const kv_backend_t *b, const kv_convert_params_t *p)
{
    if (b && b->ops && b->ops->convert)
        return b->ops->convert(b->ctx, p);
    return kv_cpu_convert(NULL, p);
}

int kv_backend_merge_select(const kv_backend_t *b, const kv_merge_params_t *p)
{
    if (b && b->ops && b->ops->merge_select)
        return b->ops->merge_select(b->ctx, p);
    return kv_cpu_merge_select(NULL, p);
}

int kv_backend_merge(const kv_backend_t *b, const kv_merge_params_t *p)
{
    if (b && b->ops && b->ops->merge)
        return b->ops->merge(b->ctx, p);
    return kv_cpu_merge(NULL, p);
}

int kv_backend_zip_score(const kv_backend_t *b, const kv_zip_score_params_t *p)
{
    if (b && b->ops && b->ops->zip_score)
        return b->ops->zip_score(b->ctx, p);
    return kv_cpu_zip_score(NULL, p);
}
