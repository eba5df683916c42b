/* SPDX-License-Identifier: MIT */
/*
 * fuzz_util.h — what the page-file fuzz targets share: a scratch directory
 * for the files each input becomes, and writing seed inputs.
 *
 * Scratch: $KV_FUZZ_DIR, else /dev/shm (tmpfs: no disk I/O per input, and
 * buffered I/O, as the page file falls back to there), else /tmp; one
 * mkdtemp() directory per process, removed at exit.
 *
 * Seeds: with KV_FUZZ_WRITE_SEEDS=DIR in the environment, a target's
 * LLVMFuzzerInitialize builds real page files through the library, turns
 * them into inputs of its own format, writes them into DIR and exits: the
 * corpora under fuzz/corpus/ were made so (fuzz/README.md).
 */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fz_dir[512];

static void fz_dir_remove(void)
{
    DIR *d = opendir(fz_dir);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", fz_dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(fz_dir);
}

static void fz_dir_make(const char *tag)
{
    const char *base = getenv("KV_FUZZ_DIR");
    if (!base || !*base)
        base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fz_dir, sizeof fz_dir, "%s/kvpage-%s-XXXXXX", base, tag);
    if (!mkdtemp(fz_dir)) {
        perror("fuzz: mkdtemp");
        exit(1);
    }
    atexit(fz_dir_remove);
}

/* fz_dir/name into out (1024 bytes). */
static const char *fz_path(const char *name, char *out)
{
    snprintf(out, 1024, "%s/%s", fz_dir, name);
    return out;
}

static int fz_write(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* KV_FUZZ_WRITE_SEEDS, or NULL. */
static const char *fz_seed_dir(void)
{
    const char *d = getenv("KV_FUZZ_WRITE_SEEDS");
    return d && *d ? d : NULL;
}

static void fz_seed(const char *dir, const char *name, const void *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (fz_write(path, p, n)) {
        fprintf(stderr, "fuzz: cannot write seed %s\n", path);
        exit(1);
    }
}

static void fz_check(int cond, const char *target, const char *what)
{
    if (!cond) {
        fprintf(stderr, "%s: property failed: %s\n", target, what);
        abort();
    }
}

#endif /* FUZZ_UTIL_H */
