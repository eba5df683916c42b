/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_int.h — internal to remote/: the client's state, shared by the
 * URL parser (kv_remote_url.c), the connections (kv_remote_conn.c), the
 * cluster slot map (kv_remote_cluster.c) and the call engine (kv_remote.c).
 *
 * Ownership: the client owns its nodes (each with a socket and a hiredis
 * reader while connected), the slot map and the scratch buffers. Nodes are
 * added when a slot map or a MOVED/ASK names a new address, never removed
 * before destroy: a node index stays valid for the client's life.
 *
 * Replies: every command written to a node pushes one entry on its fifo (an
 * op index of the running call, or a KV_FIFO_* marker), and replies are
 * matched to entries in order. A node whose connection fails or whose reply
 * does not arrive by the deadline is closed, so a fifo never outlives the
 * connection it was written to.
 */
#ifndef KV_REMOTE_INT_H
#define KV_REMOTE_INT_H

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "remote/kv_remote.h"

#define KV_REMOTE_MAX_IOV 1024      /* pieces of one payload                */
#define KV_REMOTE_MAX_HOST 255u     /* bytes of a host name                 */
#define KV_REMOTE_SLOTS 16384u      /* Redis Cluster hash slots             */
#define KV_REMOTE_NO_NODE 0xFFFFu   /* slot map: slot not served            */
#define KV_REMOTE_RBUF (256u << 10) /* bytes per read() from a socket       */

#define KV_FIFO_ASKING 0xFFFFFFFEu  /* reply of an ASKING: ignored          */
#define KV_FIFO_SLOTS 0xFFFFFFFDu   /* reply of CLUSTER SLOTS               */
#define KV_FIFO_AUTH 0xFFFFFFFCu    /* reply of the AUTH a connect sends    */
#define KV_REMOTE_RETRY 1           /* on_fail status: resend (idle drop)   */

typedef struct kv_remote_addr {
    char host[KV_REMOTE_MAX_HOST + 1];
    uint16_t port;
} kv_remote_addr_t;

typedef struct kv_remote_node {
    kv_remote_addr_t addr;
    int fd;                /* -1: not connected                               */
    void *ssl;             /* SSL over fd (rediss), NULL otherwise            */
    int fail_rc;           /* what a connect in backoff answers: KV_EAUTH,    */
                           /* KV_ETLS, or 0 (KV_EIO)                          */
    void *reader;          /* redisReader while connected                     */
    uint32_t fails;        /* consecutive failures (backoff exponent)         */
    uint64_t retry_ns;     /* no connect attempt before this (monotonic ns)   */
    char *out;             /* bytes to send this round                        */
    size_t out_len, out_off, out_cap;
    uint32_t *fifo;        /* entries awaiting replies, in order              */
    size_t fifo_n, fifo_head, fifo_cap;
    uint64_t epoch_connect; /* client epoch (call) of the connect             */
    uint64_t epoch_reply;  /* client epoch of the last reply                  */
} kv_remote_node_t;

enum { KV_REMOTE_MODE_UNKNOWN, KV_REMOTE_MODE_SINGLE, KV_REMOTE_MODE_CLUSTER };

/* Counters, in kv_remote_stats_t's field order. */
enum {
    KV_RC_GETS, KV_RC_HITS, KV_RC_MISSES, KV_RC_CORRUPT, KV_RC_ERRORS, KV_RC_TIMEOUTS,
    KV_RC_SETS, KV_RC_STORED, KV_RC_BYTES_IN, KV_RC_BYTES_OUT, KV_RC_MOVED, KV_RC_ASKED,
    KV_RC_SLOT_MAPS, KV_RC_CONNECTS, KV_RC_CONNECT_FAILURES, KV_RC_UNAUTH, KV_RC_AUTH_FAILURES,
    KV_RC_DENIED, KV_RC_TLS_FAILURES, KV_RC_COUNT
};

struct kv_remote {
    kv_remote_config_t cfg;       /* defaults filled; url/ns point below     */
    char *url;                    /* copy of cfg.url                         */
    size_t url_bytes;             /* its allocation (strlen + 1)             */
    char *auth;                   /* the AUTH command (RESP), NULL: none;    */
    size_t auth_len, auth_bytes;  /* its length, allocation; wiped at destroy */
    void *tls;                    /* SSL_CTX (rediss), NULL otherwise        */
    char ns[KV_REMOTE_MAX_NS + 1];
    kv_remote_addr_t *seeds;      /* [n_seeds], from the url                 */
    uint32_t n_seeds;
    kv_remote_node_t **nodes;     /* [n_nodes] of [KV_REMOTE_MAX_NODES]      */
    uint32_t n_nodes;
    int mode;                     /* KV_REMOTE_MODE_*                        */
    int stale;                    /* fetch the slot map at the next call     */
    uint64_t map_ns;              /* no fetch before this (monotonic ns)     */
    uint32_t single;              /* the node, in single mode                */
    uint16_t *slot_node;          /* [KV_REMOTE_SLOTS] node index or NO_NODE */
    void *slots_reply;            /* CLUSTER SLOTS reply being collected     */
    char *rbuf;                   /* [KV_REMOTE_RBUF] socket read buffer     */
    struct pollfd *pfd;           /* [KV_REMOTE_MAX_NODES] for kv_remote_io  */
    uint32_t *pwho;               /* [KV_REMOTE_MAX_NODES] node of each pfd  */
    uint64_t rng;                 /* backoff jitter                          */
    uint64_t epoch;               /* calls so far (+1 per public call)       */
    struct kv_remote_mac *mac;    /* value MACs (cfg.mac_key); NULL: none    */
    struct kv_op *ops;            /* [ops_cap] per-key state of a call       */
    size_t ops_cap;
    _Atomic uint64_t c[KV_RC_COUNT];
};

static inline void kv_remote_count(struct kv_remote *r, int i, uint64_t n)
{
    atomic_fetch_add_explicit(&r->c[i], n, memory_order_relaxed);
}

/* kv_remote_mac.c: HMAC-SHA-256 of signed values under the current key
 * (slot 0, signs and checks) and the previous one (checks only). --------- */
typedef struct kv_remote_mac kv_remote_mac_t;
/* 0 if (key, len) is a valid MAC key or (NULL, 0); KV_EINVAL, KV_ERANGE. */
int kv_remote_mac_check_key(const void *key, uint32_t len);
/* Keys checked by kv_remote_mac_check_key; prev may be NULL. Errors:
 * KV_ENOMEM, KV_ENOTSUP (no HMAC in libcrypto), KV_EIO (libcrypto failed). */
int kv_remote_mac_create(const uint8_t *key, size_t len, const uint8_t *prev, size_t prev_len,
                         kv_remote_mac_t **out);
void kv_remote_mac_destroy(kv_remote_mac_t *m);
/* The current key's id (header bytes 56..59 of what it signs). */
uint32_t kv_remote_mac_id(const kv_remote_mac_t *m);
/* The MAC of header bytes 0..63, ns and the payload, under the current key. */
int kv_remote_mac_sign(kv_remote_mac_t *m, const uint8_t *hdr, const char *ns,
                       const struct iovec *iov, int iovcnt, uint8_t out[32]);
/* 0 if hdr[64..95] is the MAC of (hdr[0..63], ns, payload) under the key
 * whose id is in hdr[56..59] (current or previous), compared in constant
 * time; else KV_ECORRUPT. */
int kv_remote_mac_verify(kv_remote_mac_t *m, const uint8_t *hdr, const char *ns,
                         const void *payload, size_t len);

/* kv_remote_frame.c: a value's frame for a reader with mac (NULL: an
 * unkeyed reader). 0 (payload, len, format set); KV_REMOTE_UNAUTH: the
 * value is not authenticated for this reader (unsigned while keyed, signed
 * while unkeyed, a key not held, a MAC that differs); KV_ECORRUPT: any
 * other failed check (as kv_remote_frame_check). */
#define KV_REMOTE_UNAUTH 1
int kv_remote_frame_open(kv_remote_mac_t *mac, const char *ns, const kv_remote_key_t *key,
                         const void *value, size_t n, const uint8_t **payload, size_t *len,
                         uint32_t *format);
/* The 96-byte header of a signed value (layout 2). Errors as
 * kv_remote_frame_header, KV_EIO (libcrypto). */
int kv_remote_frame_header_signed(kv_remote_mac_t *mac, const char *ns,
                                  const kv_remote_key_t *key, uint32_t format,
                                  const struct iovec *iov, int iovcnt, size_t len,
                                  uint8_t hdr[KV_REC_FRAME_SIGNED_BYTES]);

/* kv_remote_url.c: what a url says. Credentials are %-decoded. */
typedef struct kv_remote_url {
    kv_remote_addr_t *seeds;           /* [n] kv_mem array                  */
    uint32_t n;
    int tls;                           /* "rediss://"                        */
    char user[KV_REMOTE_MAX_SECRET + 1]; /* "" = none                         */
    char pass[KV_REMOTE_MAX_SECRET + 1]; /* "" = none (the caller wipes it)   */
} kv_remote_url_t;
/* Errors: KV_EINVAL (syntax), KV_ERANGE (a credential too long), KV_ENOMEM. */
int kv_remote_url_parse(const char *url, kv_remote_url_t *out);

/* kv_remote_tls.c ------------------------------------------------------ */
/* The client's SSL_CTX from cfg (TLS 1.2+, peer verified). KV_ETLS (a file
 * cannot be loaded, the key does not match), KV_ENOMEM. */
int kv_remote_tls_ctx(const kv_remote_config_t *cfg, void **ctx);
void kv_remote_tls_ctx_free(void *ctx);
/* Handshake over n->fd (connected, non-blocking) until deadline, checking
 * the certificate against n->addr.host (a name: SNI and host name; an IP
 * address: the certificate's IP). 0, KV_ETLS, -ETIMEDOUT, KV_ENOMEM. */
int kv_remote_tls_connect(void *ctx, kv_remote_node_t *n, uint64_t deadline);
/* Bytes moved (> 0), 0 when the socket would block, or KV_EIO (reset,
 * EOF, TLS error). */
long kv_remote_tls_send(kv_remote_node_t *n, const void *p, size_t len);
long kv_remote_tls_recv(kv_remote_node_t *n, void *p, size_t len);
void kv_remote_tls_close(kv_remote_node_t *n);


/* kv_remote_frame.c: the total length of an iov (checked). */
int kv_remote_iov_len(const struct iovec *iov, int iovcnt, size_t *len);

/* kv_remote_conn.c ----------------------------------------------------- */
uint64_t kv_remote_now_ns(void);
/* The node of addr (added if new). Errors: KV_ELIMIT (table full), KV_ENOMEM. */
int kv_remote_node_get(struct kv_remote *r, const kv_remote_addr_t *addr, uint32_t *idx);
/* Connect node (if not connected and not in backoff), bounded by
 * min(connect_timeout, deadline). 0, KV_EIO (refused, in backoff) or
 * -ETIMEDOUT; failures start the node's backoff. */
int kv_remote_node_connect(struct kv_remote *r, kv_remote_node_t *n, uint64_t deadline);
/* 1 if an error reply is an authentication or permission refusal
 * (-NOAUTH, -WRONGPASS, -NOPERM). */
int kv_remote_auth_refused(const void *reply);
/* Close after a failure: the backoff grows. */
void kv_remote_node_fail(struct kv_remote *r, kv_remote_node_t *n);
void kv_remote_node_close(kv_remote_node_t *n);
void kv_remote_node_free(kv_remote_node_t *n);
/* Room for need more elements of elem bytes after used in *arr (capacity
 * *cap, doubling from 64); KV_ENOMEM leaves everything as it was. */
int kv_remote_grow(void **arr, size_t *cap, size_t used, size_t need, size_t elem);
/* Output: reserve room for bytes and fifo entries first (KV_ENOMEM, nothing
 * changed), then append / push / cmd cannot fail. A command of argc bulk
 * strings takes at most kv_remote_cmd_bytes(argc, lens) bytes. */
int kv_remote_node_reserve(kv_remote_node_t *n, size_t bytes, size_t entries);
void kv_remote_node_append(kv_remote_node_t *n, const void *p, size_t len);
void kv_remote_node_push(kv_remote_node_t *n, uint32_t entry);
size_t kv_remote_cmd_bytes(int argc, const size_t *lens);
void kv_remote_node_cmd(kv_remote_node_t *n, int argc, const char *const *argv,
                        const size_t *lens);

/* Called by kv_remote_io for every reply: entry is the node's fifo entry.
 * Returns 0, or an error that fails the node (its connection is closed). */
typedef int (*kv_remote_reply_fn)(struct kv_remote *r, void *call, uint32_t node_idx,
                                  uint32_t entry, void *reply);
/* Flush every node's output and read the replies its fifo awaits, all nodes
 * at once, until every fifo is empty or the deadline passes. A node that
 * fails gets fail(call, node, entry, status) for each entry still waiting
 * (KV_EIO, -ETIMEDOUT at the deadline, or KV_REMOTE_RETRY: a connection
 * from an earlier call dropped before answering, resend) and is closed. */
typedef void (*kv_remote_fail_fn)(struct kv_remote *r, void *call, uint32_t entry, int status);
void kv_remote_io(struct kv_remote *r, uint64_t deadline, kv_remote_reply_fn on_reply,
                  kv_remote_fail_fn on_fail, void *call);

/* kv_remote_cluster.c: find out the mode and slot map (mode UNKNOWN or
 * stale), within the deadline. 0 or the last error (KV_EIO, -ETIMEDOUT,
 * KV_ENOMEM); the old map stays in use on failure. */
int kv_remote_discover(struct kv_remote *r, uint64_t deadline);

#endif /* KV_REMOTE_INT_H */
