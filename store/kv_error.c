/* SPDX-License-Identifier: MIT */
/*
 * kv_error.c — kv_strerror() and kv_version().
 *
 * Every KV_E* code has exactly one message here; negative values that are
 * not KV_E* codes are -errno from the OS and go through strerror_r.
 */
#include <string.h>

#include "kvpage/kvpage.h"

#ifndef KVPAGE_VERSION_STRING
#define KVPAGE_VERSION_STRING "0.0.0"
#endif

static const struct {
    int code;
    const char *msg;
} kv_errors[] = {
    {KV_OK, "success"},
    {KV_EINVAL, "invalid argument (NULL pointer, zero size or unknown value)"},
    {KV_ENOMEM, "out of memory (no free page in the pool, or metadata allocation failed)"},
    {KV_ERANGE, "value out of range (layer, head, token index, size or K/V value)"},
    {KV_ENOENT, "no such sequence"},
    {KV_ESTATE, "object in the wrong state for this operation"},
    {KV_ENOTSUP, "not supported in this build"},
    {KV_EVERSION, "config struct size or version not understood"},
    {KV_ECORRUPT, "data or internal state failed its integrity check"},
    {KV_EIO, "I/O error"},
    {KV_ELIMIT, "a fixed limit was reached"},
    {KV_ENOTRES, "page not resident (it is on the page file)"},
    {KV_EBUSY, "busy: the page file is owned by another store (in this process or another)"},
    {KV_EAUTH, "the remote tier refused authentication or permission (AUTH, NOAUTH, NOPERM)"},
    {KV_ETLS, "the remote tier's TLS failed (certificate files, handshake or verification)"},
};

const char *kv_strerror(int err)
{
    for (size_t i = 0; i < sizeof kv_errors / sizeof kv_errors[0]; i++)
        if (kv_errors[i].code == err)
            return kv_errors[i].msg;
    if (err < 0 && err > -1000) {
        /* strerror of glibc returns a static string for known errno values
         * and is thread-safe for them since glibc 2.32. */
        return strerror(-err);
    }
    return "unknown error code";
}

const char *kv_version(void)
{
    return KVPAGE_VERSION_STRING;
}
