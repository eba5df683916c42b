/* SPDX-License-Identifier: MIT */
/*
 * test_dlopen.c — libkvpage.so loads with dlopen into a process that links
 * neither kvpage nor jemalloc, the way a Python extension, a plugin or an
 * FFI loads it: no LD_PRELOAD, no tunables. (A library that links jemalloc
 * fails here with "cannot allocate memory in static TLS block".)
 *
 * Checks: jemalloc is not in the process before the dlopen, and the dlopen
 * does not bring it in; the library's functions resolve by name and work:
 * version, error names, and a store that appends three tokens and returns
 * their mean from decode attention (equal keys: equal weights).
 *
 * The library stays loaded to the end, as with Python's ctypes: after a
 * dlclose, LeakSanitizer reports the process-lifetime allocations of the
 * libraries unloaded with it (libgomp's initializer, in the sanitizer build
 * while the build links OpenMP) as leaks.
 *
 * Usage: test_dlopen LIBKVPAGE_SO. Links only libc (and libdl).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "kvpage/kvpage.h"

#define FAIL(...) (fprintf(stderr, "test_dlopen: " __VA_ARGS__), fputc('\n', stderr), 1)

static void *lib;

/* The function `name` of the library, or NULL (reported). */
static void *sym(const char *name)
{
    void *p = dlsym(lib, name);
    if (!p)
        fprintf(stderr, "test_dlopen: dlsym %s: %s\n", name, dlerror());
    return p;
}

static int jemalloc_loaded(void)
{
    return dlopen("libjemalloc.so.2", RTLD_LAZY | RTLD_NOLOAD) != NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return FAIL("usage: test_dlopen LIBKVPAGE_SO");
    if (jemalloc_loaded())
        return FAIL("jemalloc is already in this process: the test would prove nothing");
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return FAIL("dlopen %s: %s", argv[1], dlerror());
    if (jemalloc_loaded())
        return FAIL("loading %s brought jemalloc in", argv[1]);

    const char *(*version)(void);
    const char *(*strerror_)(int);
    int (*config_init)(kv_config_t *, uint32_t);
    int (*store_create)(const kv_config_t *, kv_store_t **);
    void (*store_destroy)(kv_store_t *);
    int (*seq_create)(kv_store_t *, kv_seq_id_t *);
    int (*append)(kv_store_t *, kv_seq_id_t, uint32_t, uint32_t, kv_dtype_t, const void *,
                  const void *, const int32_t *);
    int (*decode)(kv_store_t *, const kv_decode_t *);
    /* POSIX: a function pointer is stored through a void * of the same size */
    *(void **)&version = sym("kv_version");
    *(void **)&strerror_ = sym("kv_strerror");
    *(void **)&config_init = sym("kv_config_init");
    *(void **)&store_create = sym("kv_store_create");
    *(void **)&store_destroy = sym("kv_store_destroy");
    *(void **)&seq_create = sym("kv_seq_create");
    *(void **)&append = sym("kv_append");
    *(void **)&decode = sym("kv_attn_decode");
    if (!version || !strerror_ || !config_init || !store_create || !store_destroy ||
        !seq_create || !append || !decode)
        return 1;
    if (strcmp(version(), KV_EXPECT_VERSION) != 0)
        return FAIL("kv_version() = '%s', expected '%s'", version(), KV_EXPECT_VERSION);
    if (strcmp(strerror_(KV_ENOMEM), strerror_(KV_EINVAL)) == 0)
        return FAIL("kv_strerror gives one text for two codes");

    enum { D = 16, T = 3 };
    kv_config_t cfg;
    if (config_init(&cfg, (uint32_t)sizeof cfg))
        return 1;
    cfg.n_layers = 1;
    cfg.n_q_heads = 1;
    cfg.n_kv_heads = 1;
    cfg.head_dim = D;
    cfg.host_pages = 8;
    float k[T][D], v[T][D], q[D], out[D];
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) {
            k[t][d] = 1.0f;
            v[t][d] = (float)(t + 1);
        }
    for (int d = 0; d < D; d++)
        q[d] = 0.5f;
    kv_store_t *st = NULL;
    kv_seq_id_t seq;
    int rc = store_create(&cfg, &st);
    if (!rc)
        rc = seq_create(st, &seq);
    if (!rc)
        rc = append(st, seq, 0, T, KV_DTYPE_F32, k, v, NULL);
    kv_decode_t dc = {.layer = 0, .batch = 1, .seqs = &seq, .q = q, .out = out};
    if (!rc)
        rc = decode(st, &dc);
    store_destroy(st);
    if (rc)
        return FAIL("store calls failed: %s (%d)", strerror_(rc), rc);
    for (int d = 0; d < D; d++)
        if (out[d] < 1.999f || out[d] > 2.001f)
            return FAIL("decode output[%d] = %g, expected 2 (the mean of 1, 2, 3)", d,
                        (double)out[d]);
    printf("test_dlopen: %s loaded without jemalloc; version %s; decode ok\n", argv[1],
           KV_EXPECT_VERSION);
    return 0;
}
