/* SPDX-License-Identifier: MIT */
/*
 * kv_cli_remote.c — the remote tier's options that the commands taking
 * --remote share (run, stress; the table entries are KV_CLI_REMOTE_OPTS in
 * kv_cli.h): credentials and TLS (--remote-password-file/-env,
 * --remote-tls-ca/-cert/-key) and the deployment's key prefix and MAC keys
 * (--remote-ns, --remote-mac, --remote-mac-prev). Their check, their
 * kv_config_t fields, and the url as the tool prints it, never with its
 * password (kv_prefix_remote_redact). Password and key sources are passed
 * on as given (paths, variable names, "file:PATH", "env:NAME"); the store
 * reads the secrets, never this tool.
 */
#include <stdio.h>

#include "kv_cli.h"

int kv_cli_remote_given(const kv_cli_remote_t *r)
{
    return r->password_file || r->password_env || r->tls_ca || r->tls_cert || r->tls_key;
}

int kv_cli_remote_check(const char *cmd, const kv_cli_remote_t *r, const char *remote)
{
    if ((kv_cli_remote_given(r) || r->ns || r->mac || r->mac_prev) && !remote) {
        fprintf(stderr, "kvpage %s: --remote-password-*, --remote-tls-*, --remote-ns, "
                        "--remote-mac and --remote-mac-prev need --remote\n", cmd);
        return 2;
    }
    if (r->mac_prev && !r->mac) {
        fprintf(stderr, "kvpage %s: --remote-mac-prev needs --remote-mac (the new key)\n", cmd);
        return 2;
    }
    return 0;
}

void kv_cli_remote_apply(const kv_cli_remote_t *r, kv_config_t *c)
{
    c->prefix_remote_password_file = r->password_file;
    c->prefix_remote_password_env = r->password_env;
    c->prefix_remote_tls_ca = r->tls_ca;
    c->prefix_remote_tls_cert = r->tls_cert;
    c->prefix_remote_tls_key = r->tls_key;
    c->prefix_remote_ns = r->ns;
    c->prefix_remote_mac = r->mac;
    c->prefix_remote_mac_prev = r->mac_prev;
}

const char *kv_cli_remote_shown(const char *url, char *buf, size_t cap)
{
    if (!url)
        return NULL;
    if (kv_prefix_remote_redact(url, buf, cap) < 0)
        snprintf(buf, cap, "(url hidden)");
    return buf;
}
