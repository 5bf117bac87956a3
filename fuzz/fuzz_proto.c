/* libFuzzer target for the protocol decoders: the input is one message as a hostile
 * peer could place it in a slot (type, body, payload). Whatever the bytes, decoding
 * ends in success or an error, never a bad access; a decoded submission's parts lie
 * inside the payload and satisfy the documented limits, and re-encoding a decoded
 * submission gives back the same payload bytes; a decoded SAMPLES (or PAUSE/RESUME)
 * has no payload and its reserved field clear; a decoded WIPE's salt is the whole
 * payload, within the salt bound, under a non-zero id; a decoded WIPED has its reserved
 * field clear. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_in(const void *p, size_t n, const unsigned char *base, size_t len)
{
    const unsigned char *q = p;
    if (n && (q < base || q + n > base + len))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned char payload[1 << 16] __attribute__((aligned(8)));
    static unsigned char again[1 << 16] __attribute__((aligned(8)));
    kvg_shm_msg m;
    char err[256];

    if (size < 3)
        return 0;
    memset(&m, 0, sizeof m);
    m.type = data[0] % 13;   /* 0 (no such type) .. KVG_MSG_WIPED */
    m.body_len = data[1] % (KVG_SHM_BODY_MAX + 1);
    data += 2;
    size -= 2;
    size_t bl = m.body_len < size ? m.body_len : size;
    memcpy(m.body, data, bl);
    /* Most bodies should carry the right version to get past the first check. */
    if (m.body_len >= 4 && !(data[0] & 0x80)) {
        uint32_t v = KVG_PROTO_VERSION;
        memcpy(m.body, &v, 4);
    }
    size_t pl = size - bl;
    if (pl > sizeof payload)
        pl = sizeof payload;
    memcpy(payload, data + bl, pl);
    m.payload = payload;
    m.payload_len = (uint32_t)pl;

    kvg_submit_view v;
    uint64_t id;
    if (kvg_proto_decode_submit(&m, &v, &id, err, sizeof err) == 0) {
        const kvg_msg_submit *h = &v.h;
        if (h->n < 1 || h->n > KVG_PROTO_MAX_N || h->n_stop > KVG_PROTO_MAX_STOP || h->salt_len > KVG_PROTO_MAX_SALT ||
            h->n_stop_ids > KVG_PROTO_MAX_STOP_IDS || h->n_tokens < 1)
            abort();
        check_in(v.salt, h->salt_len, payload, pl);
        check_in(v.tokens, (size_t)h->n_tokens * 4, payload, pl);
        check_in(v.hashes, (size_t)h->n_block_hashes * KVG_PREFIX_HASH_LEN, payload, pl);
        check_in(v.stop_ids, (size_t)h->n_stop_ids * 4, payload, pl);
        check_in(v.stop_len, (size_t)h->n_stop * 4, payload, pl);
        check_in(v.stop_bytes, h->stop_bytes, payload, pl);
        size_t sum = 0;
        for (uint32_t i = 0; i < h->n_stop; i++) {
            if (v.stop_len[i] < 1 || v.stop_len[i] > KVG_PROTO_MAX_STOP_LEN)
                abort();
            sum += v.stop_len[i];
        }
        if (sum != h->stop_bytes || memchr(v.stop_bytes, 0, h->stop_bytes))
            abort();
        size_t n = kvg_proto_encode_submit(&v, again, sizeof again);
        if (n != pl)
            abort();
    }
    kvg_tokens_view t;
    if (kvg_proto_decode_tokens(&m, &t, err, sizeof err) == 0) {
        check_in(t.ids, (size_t)t.h.n_tokens * 4, payload, pl);
        if (t.logprobs)
            check_in(t.logprobs, (size_t)t.h.n_tokens * 4, payload, pl);
        check_in(t.text, t.h.text_len, payload, pl);
    }
    kvg_msg_error e;
    const char *msg;
    if (kvg_proto_decode_error(&m, &e, &msg, err, sizeof err) == 0) {
        if (e.message_len > KVG_PROTO_MAX_ERROR_LEN)
            abort();
        check_in(msg, e.message_len, payload, pl);
    }
    kvg_msg_done d;
    kvg_proto_decode_fixed(&m, KVG_MSG_DONE, &d, sizeof d, err, sizeof err);
    kvg_msg_cancel c;
    kvg_proto_decode_fixed(&m, KVG_MSG_CANCEL, &c, sizeof c, err, sizeof err);
    kvg_msg_samples sm;
    if (kvg_proto_decode_samples(&m, &sm, err, sizeof err) == 0 &&
        (m.type != KVG_MSG_SAMPLES || m.payload_len != 0 || sm.reserved != 0 || sm.version != KVG_PROTO_VERSION))
        abort();
    kvg_msg_pause h;
    int paused;
    if (kvg_proto_decode_pause(&m, &h, &paused, err, sizeof err) == 0 && h.reserved != 0)
        abort();
    kvg_msg_wipe w;
    const uint8_t *salt;
    if (kvg_proto_decode_wipe(&m, &w, &salt, &id, err, sizeof err) == 0) {
        if (m.type != KVG_MSG_WIPE || w.request_id == 0 || id != w.request_id || w.flags != 0 || w.reserved != 0 ||
            w.salt_len > KVG_PROTO_MAX_SALT || w.salt_len != pl)
            abort();
        check_in(salt, w.salt_len, payload, pl);
    }
    kvg_msg_wiped wd;
    if (kvg_proto_decode_wiped(&m, &wd, err, sizeof err) == 0 && (m.type != KVG_MSG_WIPED || wd.reserved != 0))
        abort();
    return 0;
}
