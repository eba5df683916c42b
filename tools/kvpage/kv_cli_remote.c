/* SPDX-License-Identifier: MIT */
/*
 * kv_cli_remote.c — the remote tier's deployment options that `kvpage run`
 * and `kvpage stress` share (--remote-ns, --remote-mac, --remote-mac-prev;
 * the table entries are KV_CLI_REMOTE_OPTS in kv_cli.h): their check and
 * their kv_config_t fields. The key sources are passed on as given
 * ("file:PATH", "env:NAME"); the store reads the keys, never this tool.
 */
#include <stdio.h>

#include "kv_cli.h"
#include "kvpage/kvpage.h"

int kv_cli_remote_check(const char *cmd, const kv_cli_remote_t *o, const char *remote)
{
    if ((o->ns || o->mac || o->mac_prev) && !remote) {
        fprintf(stderr, "kvpage %s: --remote-ns, --remote-mac and --remote-mac-prev need "
                        "--remote\n", cmd);
        return 2;
    }
    if (o->mac_prev && !o->mac) {
        fprintf(stderr, "kvpage %s: --remote-mac-prev needs --remote-mac (the new key)\n", cmd);
        return 2;
    }
    return 0;
}

void kv_cli_remote_apply(const kv_cli_remote_t *o, struct kv_config *c)
{
    c->prefix_remote_ns = o->ns;
    c->prefix_remote_mac = o->mac;
    c->prefix_remote_mac_prev = o->mac_prev;
}
