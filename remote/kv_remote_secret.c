/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_secret.c — a deployment's MAC key named by a source string:
 *   "file:PATH"  the file's content (at most 4 KiB read)
 *   "env:NAME"   the environment variable's value
 * The content is the key in hex: 64..128 hex digits (32..64 bytes), an even
 * count, with whitespace (space, tab, CR, LF) allowed before and after and
 * nowhere else (`openssl rand -hex 32 > key` writes one).
 *
 * The key never leaves the caller's buffer: scratch copies are cleansed,
 * and no error path prints or returns any of it. Errors: KV_EINVAL (the
 * source string, an unset variable, content that is not such hex), -errno
 * (the file cannot be opened or read).
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvpage/kvpage.h"
#include "remote/kv_remote_int.h"

#define KV_SECRET_MAX_FILE 4096u

static int kv_hex(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int kv_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Hex text t[0..n) -> key (cap >= KV_REMOTE_MAC_KEY_MAX). */
static int kv_secret_parse(const char *t, size_t n, uint8_t *key, size_t *len)
{
    while (n && kv_space(t[n - 1]))
        n--;
    while (n && kv_space(*t))
        t++, n--;
    if (n % 2 || n < 2 * KV_REMOTE_MAC_KEY_MIN || n > 2 * KV_REMOTE_MAC_KEY_MAX)
        return KV_EINVAL;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = kv_hex(t[2 * i]), lo = kv_hex(t[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return KV_EINVAL;
        key[i] = (uint8_t)(hi << 4 | lo);
    }
    *len = n / 2;
    return 0;
}

int kv_remote_secret_check(const char *src)
{
    if (!src)
        return 0;
    if (!strncmp(src, "file:", 5) && src[5])
        return 0;
    if (!strncmp(src, "env:", 4) && src[4] && !strchr(src + 4, '='))
        return 0;
    return KV_EINVAL;
}

int kv_remote_secret_load(const char *src, uint8_t key[KV_REMOTE_MAC_KEY_MAX], size_t *len)
{
    if (!src || !key || !len || kv_remote_secret_check(src))
        return KV_EINVAL;
    if (src[0] == 'e') {
        const char *v = getenv(src + 4);
        return v ? kv_secret_parse(v, strlen(v), key, len) : KV_EINVAL;
    }
    int fd = open(src + 5, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char buf[KV_SECRET_MAX_FILE];
    size_t n = 0;
    int rc = 0;
    while (n < sizeof buf) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rc = -errno;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (!rc)
        rc = n == sizeof buf ? KV_EINVAL : kv_secret_parse(buf, n, key, len);
    OPENSSL_cleanse(buf, n);
    return rc;
}
