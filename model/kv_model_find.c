/* SPDX-License-Identifier: MIT */
/*
 * kv_model_find.c — where the model file is and whether it is intact.
 *
 * Search order (first that is set wins; see kv_model.h): the --model flag,
 * $KVPAGE_MODEL, $KVPAGE_MODEL_DIR/<file>, ${XDG_CACHE_HOME:-$HOME/.cache}/
 * kvpage/<file>. scripts/fetch_model.sh writes to the same default place.
 * A missing file gets a message listing where we looked and how to fetch
 * it (a directory or FIFO is named as such, never "not found"); a file claiming to be ours (default name, or the pinned size) must
 * have the pinned size and SHA-256 (hashed here unless the record that
 * scripts/fetch_model.sh leaves beside it vouches for it and is newer).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_model_int.h"
#include "kv_sha256.h"

int kv_model_errf(char *err, size_t err_len, int code, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int put(char *out, size_t out_len, const char *a, const char *b, const char *c)
{
    int n = snprintf(out, out_len, "%s%s%s", a, b ? b : "", c ? c : "");
    return n < 0 || (size_t)n >= out_len ? KV_ERANGE : 0;
}

int kv_model_find(const char *flag, char *out, size_t out_len, int *pinned, char *err,
                  size_t err_len)
{
    if (!out || !out_len || !pinned)
        return KV_EINVAL;
    *pinned = 0;
    const char *env = getenv("KVPAGE_MODEL"), *dir = getenv("KVPAGE_MODEL_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int rc;
    if (flag && *flag) {
        rc = put(out, out_len, flag, NULL, NULL);
    } else if (env && *env) {
        rc = put(out, out_len, env, NULL, NULL);
    } else {
        *pinned = 1;
        if (dir && *dir)
            rc = put(out, out_len, dir, "/", KV_MODEL_FILE_NAME);
        else if (xdg && *xdg)
            rc = put(out, out_len, xdg, "/kvpage/", KV_MODEL_FILE_NAME);
        else if (home && *home)
            rc = put(out, out_len, home, "/.cache/kvpage/", KV_MODEL_FILE_NAME);
        else
            return kv_model_errf(err, err_len, KV_ENOENT,
                         "model: no HOME, XDG_CACHE_HOME or KVPAGE_MODEL_DIR to look in; "
                         "set KVPAGE_MODEL to the .gguf file or %s", KV_MODEL_FETCH_HINT);
    }
    if (rc)
        return kv_model_errf(err, err_len, rc, "model: path too long");
    struct stat st;
    const char *from = flag && *flag ? "--model" : env && *env ? "KVPAGE_MODEL" : "the cache";
    if (stat(out, &st) != 0) {
        int e = errno;
        if (e != ENOENT && e != ENOTDIR)
            return kv_model_errf(err, err_len, -e, "model: cannot use %s (%s): %s", out, from,
                                 strerror(e));
        return kv_model_errf(err, err_len, KV_ENOENT,
                     "model: %s not found (%s; looked at %s): %s", KV_MODEL_FILE_NAME, from,
                     out, KV_MODEL_FETCH_HINT);
    }
    if (!S_ISREG(st.st_mode))
        return kv_model_errf(err, err_len, KV_EINVAL,
                     "model: %s (%s) is %s, not a .gguf file", out, from,
                     S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : "not a regular file");
    return 0;
}

/* fetch_model.sh writes "<sha256>  <name>" to <path>.sha256 after checking
 * the file. If that record names the pinned hash and is not older than the
 * file, the file is as fetched: no need to hash 98 MB again. */
static int recorded_ok(const char *path, const struct stat *st)
{
    char side[4200], buf[80];
    struct stat ss;
    if (snprintf(side, sizeof side, "%s.sha256", path) >= (int)sizeof side ||
        stat(side, &ss) || !S_ISREG(ss.st_mode) || ss.st_mtim.tv_sec < st->st_mtim.tv_sec ||
        (ss.st_mtim.tv_sec == st->st_mtim.tv_sec && ss.st_mtim.tv_nsec < st->st_mtim.tv_nsec))
        return 0;
    FILE *f = fopen(side, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, 64, f);
    fclose(f);
    return n == 64 && !memcmp(buf, KV_MODEL_FILE_SHA256, 64);
}

/* SHA-256 of what is left of fd, as 64 hex digits: 0, KV_ENOMEM, -errno. */
static int kv_model_fd_sha256(int fd, char hex[65])
{
    const size_t buf_len = 1 << 20;
    uint8_t *buf = malloc(buf_len);
    if (!buf)
        return KV_ENOMEM;
    kv_sha256_t h;
    kv_sha256_init(&h);
    ssize_t r;
    while ((r = read(fd, buf, buf_len)) > 0)
        kv_sha256_update(&h, buf, (size_t)r);
    int e = errno;
    free(buf);
    if (r < 0)
        return -e;
    uint8_t d[32];
    kv_sha256_final(&h, d);
    kv_sha256_hex(d, hex);
    return 0;
}

int kv_model_file_sha256(const char *path, int pinned, char hex[65])
{
    if (!path || !hex)
        return KV_EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = fstat(fd, &st) ? -errno : 0;
    if (!rc && pinned && (uint64_t)st.st_size == KV_MODEL_FILE_SIZE && recorded_ok(path, &st))
        memcpy(hex, KV_MODEL_FILE_SHA256, 65); /* as fetched and checked */
    else if (!rc)
        rc = kv_model_fd_sha256(fd, hex);
    close(fd);
    return rc;
}

int kv_model_verify(const char *path, int pinned, char *err, size_t err_len)
{
    if (!path)
        return KV_EINVAL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block */
    if (fd < 0) {
        int e = errno;
        return kv_model_errf(err, err_len, -e, "model: cannot open %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return kv_model_errf(err, err_len, -e, "model: cannot stat %s: %s", path, strerror(e));
    }
    if ((uint64_t)st.st_size != KV_MODEL_FILE_SIZE) {
        close(fd);
        if (!pinned)
            return 0; /* somebody else's model: the GGUF checks will judge it */
        return kv_model_errf(err, err_len, KV_ECORRUPT,
                     "model: %s is damaged: %lld bytes, expected %llu; re-%s", path,
                     (long long)st.st_size, KV_MODEL_FILE_SIZE, KV_MODEL_FETCH_HINT);
    }
    if (recorded_ok(path, &st)) {
        close(fd);
        return 0;
    }
    char hex[65];
    int rc = kv_model_fd_sha256(fd, hex);
    close(fd);
    if (rc)
        return kv_model_errf(err, err_len, rc, "model: reading %s: %s", path,
                             rc == KV_ENOMEM ? "out of memory" : strerror(-rc));
    if (strcmp(hex, KV_MODEL_FILE_SHA256))
        return kv_model_errf(err, err_len, KV_ECORRUPT,
                     "model: %s is damaged: SHA-256 %s, expected %s; re-%s", path, hex,
                     KV_MODEL_FILE_SHA256, KV_MODEL_FETCH_HINT);
    return 0;
}
