/* SPDX-License-Identifier: MIT */
/*
 * kv_test_redis.h — real Redis servers for the remote tier's tests and its
 * benchmark, through scripts/kv_redis.sh (path in KV_REDIS_SCRIPT, set by
 * CMake): a single server or a 3-master cluster on free loopback ports in a
 * fresh temporary directory, owned by this process (the script's watchdog
 * stops them if the process dies without kv_tredis_stop; an atexit handler
 * stops them on a normal exit).
 *
 * kv_tredis_start() exits 77 (skipped) when redis-server is not installed
 * (scripts/setup.sh installs it) and 1 when the servers do not come up.
 * kv_tredis_cmd() sends one command to node i with a blocking hiredis
 * context (for test set-up: resharding by hand, corrupt values, ...).
 * kv_tredis_certs() makes TLS test certificates with the openssl command.
 * kv_tredis_start_ex() starts servers with more redis-server arguments
 * (passwords, ACL users, TLS files), the redis-cli arguments the script's
 * own probes then need, TLS only (single mode), and the AUTH arguments
 * kv_tredis_cmd sends first ("user pass" or "pass"; plaintext servers).
 */
#ifndef KV_TEST_REDIS_H
#define KV_TEST_REDIS_H

#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef KV_REDIS_SCRIPT
#error "KV_REDIS_SCRIPT (scripts/kv_redis.sh) must be defined by the build"
#endif

#define KV_TREDIS_MAX 4 /* server sets per process */

typedef struct kv_tredis {
    char dir[256];  /* the servers' directory ("" once stopped)       */
    char url[1024]; /* redis://127.0.0.1:P[,...]                       */
    int n;          /* nodes: 1 or 3                                   */
    int port[3];
    char auth[512]; /* kv_tredis_connect's AUTH arguments, "" = none   */
} kv_tredis_t;

static kv_tredis_t *kv_tredis_all[KV_TREDIS_MAX];

/* Run the script with args; its last output line into line (may be NULL). */
static inline int kv_tredis_script(const char *args, char *line, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s", KV_REDIS_SCRIPT, args);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    char buf[1024];
    while (fgets(buf, sizeof buf, f))
        if (line)
            snprintf(line, cap, "%s", buf);
    int st = pclose(f);
    if (line)
        line[strcspn(line, "\n")] = 0;
    return st == 0 ? 0 : -1;
}

static inline void kv_tredis_stop(kv_tredis_t *t)
{
    if (!t->dir[0])
        return;
    char args[512];
    snprintf(args, sizeof args, "stop '%s'", t->dir);
    kv_tredis_script(args, NULL, 0);
    t->dir[0] = 0;
}

static inline void kv_tredis_atexit(void)
{
    for (int i = 0; i < KV_TREDIS_MAX; i++)
        if (kv_tredis_all[i])
            kv_tredis_stop(kv_tredis_all[i]);
}

static inline int kv_tredis_read_int(const kv_tredis_t *t, int i, const char *what)
{
    char path[400];
    snprintf(path, sizeof path, "%s/n%d/%s", t->dir, i, what);
    FILE *f = fopen(path, "r");
    int v = -1;
    if (f) {
        if (fscanf(f, "%d", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

/* Start a "single" server or a "cluster" of 3 masters; server_args,
 * cli_args (kv_redis.sh's KV_REDIS_ARGS, KV_REDIS_CLI; NULL = none), tls
 * (KV_REDIS_TLS) and auth (see above; NULL = none). */
static inline void kv_tredis_start_ex(kv_tredis_t *t, const char *mode, const char *server_args,
                                      const char *cli_args, int tls, const char *auth)
{
    if (system("command -v redis-server >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipped: redis-server not installed (scripts/setup.sh)\n");
        exit(77);
    }
    memset(t, 0, sizeof *t);
    const char *tmp = getenv("TMPDIR");
    snprintf(t->dir, sizeof t->dir, "%s/kvredis.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(t->dir)) {
        perror("mkdtemp");
        exit(1);
    }
    static int registered;
    if (!registered++)
        atexit(kv_tredis_atexit);
    for (int i = 0; i < KV_TREDIS_MAX; i++)
        if (!kv_tredis_all[i]) {
            kv_tredis_all[i] = t;
            break;
        }
    char args[512];
    snprintf(args, sizeof args, "start '%s' %s %ld", t->dir, mode, (long)getpid());
    setenv("KV_REDIS_ARGS", server_args ? server_args : "", 1);
    setenv("KV_REDIS_CLI", cli_args ? cli_args : "", 1);
    setenv("KV_REDIS_TLS", tls ? "1" : "0", 1);
    int rc = kv_tredis_script(args, t->url, sizeof t->url);
    unsetenv("KV_REDIS_ARGS");
    unsetenv("KV_REDIS_CLI");
    unsetenv("KV_REDIS_TLS");
    snprintf(t->auth, sizeof t->auth, "%s", auth ? auth : "");
    if (rc != 0 || strncmp(t->url, "redis://", 8)) {
        fprintf(stderr, "kv_tredis_start: %s servers did not start\n", mode);
        exit(1);
    }
    t->n = strcmp(mode, "cluster") == 0 ? 3 : 1;
    for (int i = 0; i < t->n; i++)
        t->port[i] = kv_tredis_read_int(t, i, "port");
}

static inline void kv_tredis_start(kv_tredis_t *t, const char *mode)
{
    kv_tredis_start_ex(t, mode, NULL, NULL, 0, NULL);
}

/* Certificates for TLS tests, made with the openssl command in directory
 * dir (existing): ca.crt (a CA), srv.crt/srv.key (a server certificate of
 * that CA for IP 127.0.0.1 and DNS localhost), cli.crt/cli.key (a client
 * certificate of that CA), other.crt (another CA), junk.pem (not PEM).
 * Exits 77 (skipped) without openssl, 1 when it fails. */
static inline void kv_tredis_certs(const char *dir)
{
    if (system("command -v openssl >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipped: openssl not installed\n");
        exit(77);
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "(cd '%s' && set -e && k='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes' && "
             "openssl req -x509 $k -keyout ca.key -out ca.crt -days 2 -subj /CN=kv-test-ca && "
             "openssl req -x509 $k -keyout other.key -out other.crt -days 2 -subj /CN=kv-other && "
             "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' >srv.ext && "
             "openssl req $k -keyout srv.key -out srv.csr -subj /CN=kv-server && "
             "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
             "-out srv.crt -days 2 -extfile srv.ext && "
             "openssl req $k -keyout cli.key -out cli.csr -subj /CN=kv-client && "
             "openssl x509 -req -in cli.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
             "-out cli.crt -days 2 && printf 'not a certificate\\n' >junk.pem"
             ") >'%s/openssl.log' 2>&1",
             dir, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "openssl failed: see %s/openssl.log\n", dir);
        exit(1);
    }
}

static inline pid_t kv_tredis_pid(const kv_tredis_t *t, int i)
{
    return (pid_t)kv_tredis_read_int(t, i, "pid");
}

static inline int kv_tredis_signal(const kv_tredis_t *t, int i, int sig)
{
    pid_t p = kv_tredis_pid(t, i);
    return p > 0 ? kill(p, sig) : -1;
}

/* Start node i again on its port (after SIGKILL); 0 or -1. */
static inline int kv_tredis_restart(const kv_tredis_t *t, int i)
{
    char args[512];
    snprintf(args, sizeof args, "restart '%s' %d", t->dir, i);
    return kv_tredis_script(args, NULL, 0);
}

/* A blocking hiredis context to node i (5 s timeouts), or NULL. */
static inline redisContext *kv_tredis_connect(const kv_tredis_t *t, int i)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", t->port[i], tv);
    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK) {
        if (!t->auth[0])
            return c;
        char a1[256] = "", a2[256] = "";
        int k = sscanf(t->auth, "%255s %255s", a1, a2);
        redisReply *r = k == 2 ? redisCommand(c, "AUTH %s %s", a1, a2)
                               : redisCommand(c, "AUTH %s", a1);
        int ok = r && r->type == REDIS_REPLY_STATUS;
        if (r)
            freeReplyObject(r);
        if (ok)
            return c;
    }
    if (c)
        redisFree(c);
    return NULL;
}

/* One command to node i on a new connection; the reply (free with
 * freeReplyObject) or NULL. */
static inline redisReply *kv_tredis_cmd(const kv_tredis_t *t, int i, const char *fmt, ...)
{
    redisContext *c = kv_tredis_connect(t, i);
    if (!c)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

/* Same, with an argv (binary-safe values). */
static inline redisReply *kv_tredis_argv(const kv_tredis_t *t, int i, int argc,
                                         const char **argv, const size_t *lens)
{
    redisContext *c = kv_tredis_connect(t, i);
    redisReply *r = c ? redisCommandArgv(c, argc, argv, lens) : NULL;
    if (c)
        redisFree(c);
    return r;
}

#endif /* KV_TEST_REDIS_H */
