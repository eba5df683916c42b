/* SPDX-License-Identifier: MIT */
/*
 * kv_cli_remote.c — the remote tier's credential and TLS options of the
 * commands that take --remote (run, stress): into kv_config_t, and the url
 * as the tool prints it, never with its password (kv_prefix_remote_redact).
 */
#include "kv_cli.h"

int kv_cli_remote_given(const kv_cli_remote_t *r)
{
    return r->password_file || r->password_env || r->tls_ca || r->tls_cert || r->tls_key;
}

void kv_cli_remote_apply(const kv_cli_remote_t *r, kv_config_t *c)
{
    c->prefix_remote_password_file = r->password_file;
    c->prefix_remote_password_env = r->password_env;
    c->prefix_remote_tls_ca = r->tls_ca;
    c->prefix_remote_tls_cert = r->tls_cert;
    c->prefix_remote_tls_key = r->tls_key;
}

const char *kv_cli_remote_shown(const char *url, char *buf, size_t cap)
{
    if (!url)
        return NULL;
    if (kv_prefix_remote_redact(url, buf, cap) < 0)
        snprintf(buf, cap, "(url hidden)");
    return buf;
}
