/* SPDX-License-Identifier: MIT */
/*
 * stress_remote.h — chaos against the prefix cache's remote tier in
 * `kvpage stress` (--remote; docs/stress.md, "Shared prefixes"): a private
 * redis-server this process starts, kills and restarts, and corrupt values
 * written straight into the server with hiredis (not through kvpage's
 * client), so the store has to refuse them.
 *
 * The server (--remote local): `redis-server` from PATH on 127.0.0.1, a
 * random free port in 22000..31999, no persistence (--save "",
 * --appendonly no), in a fresh directory under $TMPDIR; a restart after
 * SIGKILL comes back empty on the same port (the store's URL). The child
 * dies with this process (PR_SET_PDEATHSIG), so nothing is left behind.
 *
 * Corrupt values (stress_redis_corrupt): a random existing key of the
 * namespace (RANDOMKEY until one is "<ns>:..."), its value replaced by one
 * of STRESS_BAD_COUNT kinds, in turn: random bytes; truncated; a bit
 * flipped in the header; a bit flipped in the payload; the frame's crc
 * changed (otherwise well framed); another key's value (crc right, echoed
 * hash wrong); re-framed with a valid crc around a payload whose record
 * start is wrong; re-framed around a payload with +Inf in an FP16 page;
 * empty; not a string (a list). A key whose value is no frame any more (an
 * earlier injection the store has not replaced yet) gets random bytes.
 * Every kind is one the store must refuse
 * (docs/prefix.md: frame checks, then the record and page checks); a
 * well-formed value with a valid crc and wrong but finite KV is not among
 * them: crc32c is no MAC, and the store cannot tell it (docs/prefix.md,
 * Security). The re-framed kinds recompute the frame's crc32c here, from
 * the documented format (an independent implementation: the first value
 * read is checked against it, and these kinds are skipped if it differs).
 *
 * Ownership: stress_redis_t owns its child process, directory and
 * hiredis context; stress_redis_stop releases all of them.
 */
#ifndef STRESS_REMOTE_H
#define STRESS_REMOTE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define STRESS_BAD_COUNT 10

typedef struct stress_redis {
    pid_t pid;          /* our server (0: none, or an external one)       */
    int port;           /* its port (external: the url's first seed)      */
    char host[256];     /* host the injector connects to                  */
    char dir[256];      /* our server's directory ("" when none)          */
    char url[300];      /* redis://127.0.0.1:port                         */
    void *ctx;          /* the injector's redisContext (NULL: not now)    */
    uint64_t rng;
    int crc_ok;         /* -1 unknown, 1 our crc32c matches the values'  */
    uint64_t restarts;  /* kills followed by a restart that served        */
    uint64_t restart_failures;
    uint64_t injected;  /* corrupt values written                         */
    uint64_t by_kind[STRESS_BAD_COUNT];
    uint64_t no_key;    /* injections skipped: no key of ours (server down */
                        /* or just restarted)                              */
} stress_redis_t;

/* Name of corrupt kind k ("garbage", "truncated", ...). */
const char *stress_redis_kind(int k);

/* --remote local: start a private server; 0, KV_ENOTSUP (redis-server is
 * not installed: message in err) or KV_EIO (it did not start). */
int stress_redis_spawn(stress_redis_t *r, uint64_t seed, char *err, size_t err_len);
/* An external server (url "redis://host:port[,...]": its first seed),
 * only for injection. 0 or KV_EINVAL (message in err). */
int stress_redis_attach(stress_redis_t *r, const char *url, uint64_t seed, char *err,
                        size_t err_len);
/* Kill our server (SIGKILL): it is down until stress_redis_restart. */
void stress_redis_kill(stress_redis_t *r);
/* Start it again on its port (retried for up to 5 s); 0 or -1. */
int stress_redis_restart(stress_redis_t *r);
/* Write up to n corrupt values over existing keys of namespace ns; returns
 * how many were written (fewer when the server has no such key or is down). */
uint32_t stress_redis_corrupt(stress_redis_t *r, const char *ns, uint32_t n);
/* Stop our server, remove its directory, close the context. */
void stress_redis_stop(stress_redis_t *r);

#endif /* STRESS_REMOTE_H */
