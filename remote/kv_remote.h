/* SPDX-License-Identifier: MIT */
/*
 * kv_remote.h — the remote tier: blobs kept in Redis or Valkey (one server,
 * or a Redis Cluster), shared by every engine process that points at it.
 *
 * A blob is named by a 32-byte hash (a content address, e.g. a prefix block
 * hash from prefix/kv_prefix_hash.h) in the client's namespace: the server
 * key is "<ns>:<64 lowercase hex digits>". Its value is framed (64-byte
 * header, then the payload; docs/prefix.md, "The remote tier"):
 *   magic "KVRM", layout version, header size, the caller's format tag,
 *   crc32c of the namespace, payload length, the key's hash echoed, a
 *   reserved word (0), crc32c over the header and the payload.
 * A value that fails any check (too short, magic, version, sizes, hash,
 * namespace, reserved word, crc, or a non-string under the key) is counted
 * corrupt and reported as a miss: its bytes never reach the caller.
 * With a MAC key (cfg.mac_key) values are signed instead (layout 2: a
 * 96-byte header ending in HMAC-SHA-256 over header, namespace and
 * payload, no crc), and a keyed client accepts only values signed with
 * its key or its previous one; a client without a key accepts only
 * unsigned ones. A value refused so is counted unauth (and corrupt).
 *
 * Servers: url "redis://host:port", or several comma-separated seeds for a
 * cluster ("redis://h1:p1,h2:p2" or "redis://h1:p1,redis://h2:p2"); the
 * first seed may carry credentials ("redis://user:password@h:p", or
 * "redis://:password@h:p"), and the scheme "rediss://" (on every seed)
 * makes every connection TLS (kv_remote_tls.c). Whether
 * the servers form a cluster is found out at the first call (CLUSTER SLOTS:
 * a slot map, or "cluster support disabled": one server). In a cluster every
 * key goes to the master of its CRC16 hash slot (hash tags "{...}" honoured,
 * as in Redis), batches are grouped per node and the nodes are served in
 * parallel; MOVED is followed (the slot map is patched at once and fetched
 * again at the next call), ASK is followed with ASKING, each key at most
 * max_redirects times per call.
 *
 * Time: every call returns within timeout_ms of its start (connects, slot
 * map, redirects and all), whatever the servers do (down, silent, slow):
 * sockets are non-blocking and every wait is a poll() against the call's
 * deadline. Each connect is bounded by connect_timeout_ms. A node that
 * failed (refused, reset, timed out) is not tried again before a backoff
 * delay (backoff_ms, doubling per consecutive failure up to backoff_max_ms);
 * meanwhile its keys fail at once (KV_EIO). Host names are resolved with
 * getaddrinfo (not bounded by the timeout: give IP addresses for a hard
 * bound). SIGPIPE is never raised (MSG_NOSIGNAL). A TLS handshake is part
 * of the connect and bounded the same way.
 *
 * Authentication: with a password (the url's, or cfg.password), every
 * connection the client opens (seeds, nodes named by CLUSTER SLOTS, MOVED
 * or ASK, reconnections) sends AUTH first, pipelined ahead of its commands:
 * "AUTH user password" with a user, "AUTH password" without (the default
 * user, or requirepass). A refused AUTH fails the node with KV_EAUTH (and
 * its backoff answers KV_EAUTH, not KV_EIO, until it is tried again); a
 * key answered -NOAUTH, -WRONGPASS or -NOPERM fails with KV_EAUTH. Those
 * keys are counted in `denied`, never in `misses` alone as if the key were
 * absent. A user that may not run CLUSTER SLOTS (-NOPERM) is taken as one
 * server: to use a cluster through an ACL user, grant it +cluster|slots.
 * Secrets are kept only in the client (wiped at destroy) and never printed;
 * kv_remote_url_redact gives a url fit for a log.
 *
 * Failures are per key and are misses to the caller: a call returns the
 * count of keys that succeeded, and each key's status says why one did not;
 * a negative return is bad input or memory (nothing sent). Never a crash,
 * never a wrong payload. Counters (kv_remote_stats) record everything.
 *
 * Threads: a client is used by one thread at a time (the caller serializes);
 * kv_remote_stats may be called from any thread. The publisher has a client
 * and a thread of its own. Memory: the client's own allocations go through
 * kv_mem (fault injection applies); hiredis's parser allocates its replies
 * itself, and libcrypto its HMAC contexts (a keyed client's). Errors: 0 or a negative KV_E* code, or -errno (-ETIMEDOUT).
 */
#ifndef KV_REMOTE_H
#define KV_REMOTE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "util/kv_rec.h" /* the value header: KV_REC_FRAME_BYTES, _SIGNED_BYTES */

#define KV_REMOTE_HASH_BYTES 32u
#define KV_REMOTE_MAC_KEY_MIN 32u            /* bytes of a MAC key, at least  */
#define KV_REMOTE_MAC_KEY_MAX 64u            /* ... at most                   */
#define KV_REMOTE_MAX_PAYLOAD (256u << 20)   /* largest payload of one blob   */
#define KV_REMOTE_MAX_NS 64u                 /* longest namespace             */
#define KV_REMOTE_MAX_SEEDS 64u              /* seeds in a url                */
#define KV_REMOTE_MAX_NODES 1024u            /* cluster nodes known at once   */
#define KV_REMOTE_MAX_BATCH (1u << 20)       /* keys in one call              */
#define KV_REMOTE_MAX_TIMEOUT_MS 3600000u    /* any time field                */

typedef struct kv_remote_config {
    const char *url;             /* "redis[s]://[user[:password]@]host:port"  */
                                 /* "[,host:port...]"; copied                  */
    const char *ns;              /* key namespace, 1..KV_REMOTE_MAX_NS printable */
                                 /* non-space ASCII bytes; NULL = "kvp"; copied  */
    uint32_t timeout_ms;         /* bound of every call; 0 = 1000               */
    uint32_t connect_timeout_ms; /* bound of one connect; 0 = min(200, timeout) */
    uint32_t backoff_ms;         /* first retry delay of a failed node; 0 = 50  */
    uint32_t backoff_max_ms;     /* longest delay; 0 = 5000; >= backoff_ms      */
    uint32_t ttl_ms;             /* SET ... PX ttl_ms; 0 = no expiry            */
    uint32_t max_redirects;      /* MOVED/ASK per key and call; 0 = 5, <= 64    */
    /* credentials and TLS; all NULL: the url's alone                        */
    const char *password;        /* AUTH password (1..KV_REMOTE_MAX_SECRET     */
                                 /* bytes) when the url has none; copied       */
    const char *tls_ca_file;     /* rediss: CA certificates (PEM) that verify  */
                                 /* the servers; NULL = the system's store     */
    const char *tls_cert_file;   /* rediss: client certificate chain (PEM)     */
    const char *tls_key_file;    /* rediss: its private key (PEM); both or none */
    /* value authentication (HMAC-SHA-256; docs/prefix.md, "Signed values") */
    const void *mac_key;         /* NULL: values unsigned (crc32c only); else   */
                                 /* every value is signed with this key and    */
                                 /* only signed values are accepted; copied    */
    uint32_t mac_key_len;        /* KV_REMOTE_MAC_KEY_MIN..MAX bytes            */
    uint32_t mac_prev_len;       /* bytes of mac_prev                           */
    const void *mac_prev;        /* NULL, or the key before a rotation: values  */
                                 /* it signed are still accepted; never signs;  */
                                 /* needs mac_key; copied                       */
} kv_remote_config_t;

#define KV_REMOTE_MAX_SECRET 512u /* bytes of a user name or a password     */

typedef struct kv_remote_key {
    uint8_t hash[KV_REMOTE_HASH_BYTES];
} kv_remote_key_t;

/* One key of kv_remote_get. In: key, dst, cap. Out: status, len, format. */
typedef struct kv_remote_get {
    kv_remote_key_t key;
    void *dst;          /* payload destination (cap bytes; NULL iff cap 0)     */
    size_t cap;
    size_t len;         /* payload bytes (status 0 or KV_ERANGE)               */
    uint32_t format;    /* the format tag it was stored with (status 0)        */
    int status;         /* 0 hit (dst[0..len-1] written); KV_ENOENT: no such   */
                        /* key, or a value that failed its checks (counted     */
                        /* corrupt); KV_ERANGE: payload longer than cap (len   */
                        /* set, dst untouched); KV_EIO: node unreachable, in   */
                        /* backoff, or a server error; -ETIMEDOUT; KV_ENOMEM   */
                        /* (memory for this key's command ran out mid-call);   */
                        /* KV_EAUTH: refused (credentials or ACL, see above);  */
                        /* KV_ETLS: the node's TLS handshake failed            */
} kv_remote_get_t;

/* One key of kv_remote_set: the payload is the concatenation of iov. */
typedef struct kv_remote_set {
    kv_remote_key_t key;
    uint32_t format;             /* caller's format tag, stored in the header  */
    const struct iovec *iov;     /* payload pieces (NULL iff iovcnt 0)         */
    int iovcnt;                  /* 0..1024; payload 0..MAX_PAYLOAD bytes       */
    int status;                  /* out: 0 stored; KV_EIO, -ETIMEDOUT,         */
                                 /* KV_ENOMEM, KV_EAUTH, KV_ETLS (as get)      */
} kv_remote_set_t;

/* Counters since create (all monotonic). */
typedef struct kv_remote_stats {
    uint64_t gets;        /* keys asked for (kv_remote_get, kv_remote_exists)  */
    uint64_t hits;        /* returned (payload) or found (exists)              */
    uint64_t misses;      /* not returned, for whatever reason (= gets - hits) */
    uint64_t corrupt;     /* values that failed a check (misses)               */
    uint64_t errors;      /* keys failed by a connection or server error, or   */
                          /* a node in backoff (gets and sets)                 */
    uint64_t timeouts;    /* keys failed because the call ran out of time      */
    uint64_t sets;        /* keys given to kv_remote_set                       */
    uint64_t stored;      /* sets the server acknowledged                      */
    uint64_t bytes_in;    /* payload bytes returned                            */
    uint64_t bytes_out;   /* payload bytes stored                              */
    uint64_t moved;       /* MOVED redirections followed                       */
    uint64_t asked;       /* ASK redirections followed                         */
    uint64_t slot_maps;   /* slot maps fetched (CLUSTER SLOTS)                 */
    uint64_t connects;    /* connections made                                  */
    uint64_t connect_failures; /* connects refused or timed out (TLS included)  */
    uint64_t unauth;      /* of corrupt, values refused as unauthenticated:    */
                          /* no valid MAC under the client's keys, or signed   */
                          /* while the client has no key                       */
    uint64_t auth_failures; /* connections whose AUTH was refused, and replies */
                          /* -NOAUTH to CLUSTER SLOTS (no password given)      */
    uint64_t denied;      /* keys failed with KV_EAUTH (refused AUTH, -NOAUTH, */
                          /* -WRONGPASS, -NOPERM); not in errors               */
    uint64_t tls_failures; /* TLS handshakes that failed or timed out          */
} kv_remote_stats_t;

typedef struct kv_remote kv_remote_t;

/* A client. Nothing is contacted yet (a server that is down does not fail
 * create). Errors: KV_EINVAL (NULL, a url that does not parse: scheme, host,
 * port 1..65535, KV_REMOTE_MAX_SEEDS, credentials on a later seed or a bad
 * %-escape; a bad namespace; a password both in the url and in cfg; a user
 * without a password; tls_* fields with "redis://"; a certificate without
 * its key or the reverse; a MAC key NULL with a length or a length without
 * a key, mac_prev without mac_key), KV_ERANGE (a time field or
 * max_redirects out of range, backoff_max_ms < backoff_ms, a user or
 * password longer than KV_REMOTE_MAX_SECRET, a MAC key's length), KV_ETLS
 * (the CA, certificate or key file cannot be loaded, or the key does not
 * match the certificate), KV_ENOMEM, KV_ENOTSUP (no HMAC in libcrypto). */
int kv_remote_create(const kv_remote_config_t *cfg, kv_remote_t **out);

/* Contact the servers now (connect, TLS handshake, AUTH, CLUSTER SLOTS),
 * within timeout_ms: 0, KV_EAUTH (credentials refused, or a password is
 * needed), KV_ETLS (handshake or certificate verification failed), KV_EIO
 * (unreachable), -ETIMEDOUT, KV_ENOMEM. Errors: KV_EINVAL. */
int kv_remote_probe(kv_remote_t *r);

/* url with its password replaced by "***" (everything from the first ':'
 * after the scheme to the last '@'), fit for a log or a report; written
 * into buf (NUL-terminated, truncated to cap - 1 bytes). Returns the
 * redacted url's full length, or KV_EINVAL. */
int kv_remote_url_redact(const char *url, char *buf, size_t cap);

/* Wipe len bytes of a secret (a write the compiler keeps). */
void kv_remote_wipe(void *p, size_t len);
/* Closes the connections. NULL is a no-op. */
void kv_remote_destroy(kv_remote_t *r);

/* Fetch n blobs, pipelined (grouped per node). Returns the number of hits,
 * each item's status says what happened to it; or, with nothing sent and
 * no status set: KV_EINVAL (NULL r, items NULL with n > 0, dst NULL with
 * cap > 0), KV_ERANGE (n > KV_REMOTE_MAX_BATCH), KV_ENOMEM. */
int kv_remote_get(kv_remote_t *r, kv_remote_get_t *items, size_t n);

/* Store n blobs (SET, with PX ttl_ms when set), pipelined. Returns the
 * number stored; a stored blob replaces any value under its key. Errors as
 * kv_remote_get, and KV_EINVAL for a bad iov, KV_ERANGE for a payload over
 * KV_REMOTE_MAX_PAYLOAD. */
int kv_remote_set(kv_remote_t *r, kv_remote_set_t *items, size_t n);

/* Whether each key exists (EXISTS, pipelined; the value is not read nor
 * checked). status[i]: 1 present, 0 absent, or KV_EIO / -ETIMEDOUT. Returns
 * the number present; errors as kv_remote_get. */
int kv_remote_exists(kv_remote_t *r, const kv_remote_key_t *keys, int *status, size_t n);

/* Counters (any thread). Errors: KV_EINVAL. */
int kv_remote_stats(const kv_remote_t *r, kv_remote_stats_t *out);

/* The server key of a hash in namespace ns: writes "<ns>:<hex>" and a NUL
 * into buf when it fits; returns the key's length (without the NUL), or
 * KV_EINVAL / KV_ERANGE (cap too small). */
int kv_remote_key_string(const char *ns, const kv_remote_key_t *key, char *buf, size_t cap);

/* The Redis Cluster hash slot (0..16383) of a key: CRC16-CCITT (XMODEM) of
 * the key, or of the part between the first '{' and the next '}' when that
 * part is not empty. */
uint32_t kv_remote_slot(const void *key, size_t len);

/* ---- the value frame (docs/prefix.md), for tests and other writers ------ */

/* The 64-byte header of a payload of len bytes given as iov (crc included).
 * Errors: KV_EINVAL, KV_ERANGE (len > KV_REMOTE_MAX_PAYLOAD or iov does not
 * add up to len). */
int kv_remote_frame_header(const char *ns, const kv_remote_key_t *key, uint32_t format,
                           const struct iovec *iov, int iovcnt, size_t len,
                           uint8_t hdr[KV_REC_FRAME_BYTES]);
/* Check a whole unsigned value (layout 1: header + payload, n bytes) against
 * ns and key, as a client without a MAC key does. Returns 0 and sets
 * *payload, *len, *format; or KV_ECORRUPT (a signed value too). */
int kv_remote_frame_check(const char *ns, const kv_remote_key_t *key, const void *value,
                          size_t n, const uint8_t **payload, size_t *len, uint32_t *format);

/* ---- MAC keys from where a deployment keeps them (kv_remote_secret.c) --- */

/* 0 if src is NULL, "file:PATH" or "env:NAME" (both non-empty; NAME without
 * '='), else KV_EINVAL. Reads nothing. */
int kv_remote_secret_check(const char *src);
/* Read the key src names: the file's content or the variable's value, 64..128
 * hex digits with whitespace around, into key (*len = 32..64 bytes).
 * Errors: KV_EINVAL (src, an unset variable, not such hex), -errno (file). */
int kv_remote_secret_load(const char *src, uint8_t key[KV_REMOTE_MAC_KEY_MAX], size_t *len);

/* ---- the publisher: stores blobs in the background, never blocks -------- */

typedef struct kv_remote_pub kv_remote_pub_t;

typedef struct kv_remote_pub_stats {
    uint64_t queued;          /* blobs accepted by kv_remote_pub_put           */
    uint64_t dropped;         /* refused: queue full, or no memory for a copy  */
    uint64_t published;       /* stored by the server                          */
    uint64_t failed;          /* sent but not stored (error, timeout, backoff) */
    uint64_t discarded;       /* still queued at destroy                       */
    uint64_t queue_items;     /* in the queue now                              */
    uint64_t queue_bytes;     /* payload bytes in the queue now                */
    kv_remote_stats_t client; /* its client's counters                         */
} kv_remote_pub_stats_t;

/* A publisher: its own client (cfg as kv_remote_create) and thread, and a
 * queue bounded by max_items blobs (0 = 1024, <= 2^20) and max_bytes payload
 * bytes (0 = 256 MiB). The thread sends what is queued, up to batch blobs
 * per kv_remote_set call (0 = 64). Errors: kv_remote_create's, KV_ERANGE
 * (limits), KV_ENOMEM (memory or thread). */
int kv_remote_pub_create(const kv_remote_config_t *cfg, uint32_t max_items,
                         uint64_t max_bytes, uint32_t batch, kv_remote_pub_t **out);

/* Queue a copy of a blob and return at once (the copy is made here; the
 * caller's buffers are not kept). Returns 0, or, with nothing queued:
 * KV_ELIMIT (queue full: dropped and counted), KV_ENOMEM (no memory for the
 * copy: dropped and counted), KV_EINVAL / KV_ERANGE (bad blob, as
 * kv_remote_set). Only a short critical section is shared with the thread. */
int kv_remote_pub_put(kv_remote_pub_t *p, const kv_remote_key_t *key, uint32_t format,
                      const struct iovec *iov, int iovcnt);

/* Wait until everything queued before the call has been sent (stored or
 * failed), at most timeout_ms. Returns 0, or -ETIMEDOUT, KV_EINVAL. */
int kv_remote_pub_flush(kv_remote_pub_t *p, uint32_t timeout_ms);

/* Counters (any thread). Errors: KV_EINVAL. */
int kv_remote_pub_stats(kv_remote_pub_t *p, kv_remote_pub_stats_t *out);

/* Stops the thread: the batch being sent finishes (within the client's
 * timeout), what is still queued is discarded (counted), everything is
 * freed. NULL is a no-op. */
void kv_remote_pub_destroy(kv_remote_pub_t *p);

#endif /* KV_REMOTE_H */
