/* The engine protocol's encoders and decoders: submissions round-trip part by part;
 * every count, flag and length that does not match is refused with a message naming
 * it; TOKENS, ERROR and fixed bodies check type, size and version; WIPE carries exactly
 * its salt and WIPED its counts; the statistics page
 * reads back what was written. */
#include <string.h>

#include "proto.h"
#include "tap.h"

static unsigned char payload[1 << 16] __attribute__((aligned(8)));
static char err[256];

static kvg_shm_msg msg(uint32_t type, const void *body, size_t bl, const void *p, size_t pl)
{
    kvg_shm_msg m;
    memset(&m, 0, sizeof m);
    m.type = type;
    m.body_len = (uint32_t)bl;
    memcpy(m.body, body, bl);
    m.payload = p;
    m.payload_len = (uint32_t)pl;
    return m;
}

static void fill(kvg_submit_view *v, uint32_t *toks, uint8_t (*hs)[32], uint32_t *sl)
{
    static uint32_t ids[2] = { 2, 9 };
    memset(v, 0, sizeof *v);
    for (int i = 0; i < 40; i++)
        toks[i] = (uint32_t)(100 + i);
    memset(hs, 0xab, 2 * 32);
    sl[0] = 3;
    sl[1] = 1;
    v->h.version = KVG_PROTO_VERSION;
    v->h.request_id = 42;
    v->h.bucket = 1;             /* cached (a correct client never sends bucket 0 with hashes) */
    v->h.n = 2;
    v->h.max_tokens = 10;
    v->h.top_p = 0.9f;
    v->h.temperature = 0.5f;
    v->h.salt_len = 5;
    v->h.n_tokens = 40;
    v->h.n_block_hashes = 2;
    v->h.n_stop_ids = 2;
    v->h.n_stop = 2;
    v->h.stop_bytes = 4;
    v->salt = (const uint8_t *)"acme!";
    v->tokens = toks;
    v->hashes = (const uint8_t (*)[32])hs;
    v->stop_ids = ids;
    v->stop_len = sl;
    v->stop_bytes = "endX";
}

static int refused(kvg_submit_view *v, size_t plen_delta, const char *needle)
{
    size_t n = kvg_proto_encode_submit(v, payload, sizeof payload);
    kvg_shm_msg m = msg(KVG_MSG_SUBMIT, &v->h, sizeof v->h, payload, n + plen_delta);
    kvg_submit_view out;
    uint64_t id;
    err[0] = 0;
    int rc = kvg_proto_decode_submit(&m, &out, &id, err, sizeof err);
    if (rc == 0 || !strstr(err, needle)) {
        diag("rc %d, err '%s', wanted '%s'", rc, err, needle);
        return 0;
    }
    return 1;
}

int main(void)
{
    kvg_submit_view v, out;
    uint32_t toks[40], sl[2];
    uint8_t hs[2][32];
    uint64_t id;

    fill(&v, toks, hs, sl);
    size_t n = kvg_proto_encode_submit(&v, payload, sizeof payload);
    is_int(n, kvg_proto_submit_size(&v.h), "encoded size = the layout's size");
    is_int(n, 8 + 160 + 64 + 8 + 8 + 4, "layout: salt, tokens, hashes, stop ids, stop lengths, stop bytes, 8-aligned");
    kvg_shm_msg m = msg(KVG_MSG_SUBMIT, &v.h, sizeof v.h, payload, n);
    ok(kvg_proto_decode_submit(&m, &out, &id, err, sizeof err) == 0 && id == 42, "decodes (%s)", err);
    ok(memcmp(out.salt, "acme!", 5) == 0 && memcmp(out.tokens, toks, sizeof toks) == 0 &&
       memcmp(out.hashes, hs, sizeof hs) == 0 && out.stop_ids[1] == 9 && out.stop_len[0] == 3 &&
       memcmp(out.stop_bytes, "endX", 4) == 0, "every part round-trips");
    ok(kvg_proto_encode_submit(&v, payload, n - 1) == 0, "encoding into too small a buffer: 0");

    fill(&v, toks, hs, sl);
    ok(refused(&v, 8, "does not match its counts"), "payload longer than the counts");
    ok(refused(&v, (size_t)-8, "does not match its counts"), "payload shorter than the counts");
    {
        char want[64];
        v.h.version = KVG_PROTO_VERSION + 1;
        snprintf(want, sizeof want, "protocol version %u", KVG_PROTO_VERSION + 1);
        ok(refused(&v, 0, want), "wrong version");
    }
    /* n_active travels as given: its bound (<= n) is the engine's intake's to check. */
    fill(&v, toks, hs, sl);
    v.h.n_active = 1;
    n = kvg_proto_encode_submit(&v, payload, sizeof payload);
    m = msg(KVG_MSG_SUBMIT, &v.h, sizeof v.h, payload, n);
    ok(kvg_proto_decode_submit(&m, &out, &id, err, sizeof err) == 0 && out.h.n_active == 1 && out.h.n == 2,
       "n_active round-trips (1 of n=2)");
    fill(&v, toks, hs, sl);
    v.h.request_id = 0;
    ok(refused(&v, 0, "id 0 is reserved"), "request id 0");
    fill(&v, toks, hs, sl);
    v.h.n = 17;
    ok(refused(&v, 0, "n must be 1..16"), "n = 17");
    fill(&v, toks, hs, sl);
    v.h.max_tokens = 0;
    ok(refused(&v, 0, "max_tokens"), "max_tokens = 0");
    fill(&v, toks, hs, sl);
    v.h.top_p = 1.5f;
    ok(refused(&v, 0, "top_p"), "top_p = 1.5");
    fill(&v, toks, hs, sl);
    v.h.temperature = 0.0f / 0.0f;
    ok(refused(&v, 0, "temperature"), "temperature NaN");
    fill(&v, toks, hs, sl);
    v.h.bucket = 99;
    ok(refused(&v, 0, "bucket 99"), "bucket out of range");
    fill(&v, toks, hs, sl);
    v.h.bucket = 0;
    ok(refused(&v, 0, "bypass request (bucket 0) carries no block hashes"), "bypass (bucket 0) with hashes");
    fill(&v, toks, hs, sl);
    v.h.flags = KVG_SUBMIT_OLD_BYPASS;
    v.h.bucket = 2;
    ok(refused(&v, 0, "bypass is bucket 0"), "the old bypass flag with a cached bucket");
    /* What earlier clients sent for bypass (the old flag and bucket 0, no hashes)
     * still decodes; so does the same without the flag (what clients send now). */
    for (int old = 0; old < 2; old++) {
        fill(&v, toks, hs, sl);
        v.h.flags = old ? KVG_SUBMIT_OLD_BYPASS : 0;
        v.h.bucket = 0;
        v.h.n_block_hashes = 0;
        size_t nb = kvg_proto_encode_submit(&v, payload, sizeof payload);
        m = msg(KVG_MSG_SUBMIT, &v.h, sizeof v.h, payload, nb);
        ok(kvg_proto_decode_submit(&m, &out, &id, err, sizeof err) == 0 && out.h.bucket == 0,
           "bypass as bucket 0, %s the old flag: decodes (%s)", old ? "with" : "without", err);
    }
    fill(&v, toks, hs, sl);
    sl[1] = 2;
    ok(refused(&v, 0, "sum to 5, not 4"), "stop lengths not summing to stop_bytes");
    fill(&v, toks, hs, sl);
    sl[0] = 0;
    sl[1] = 4;
    ok(refused(&v, 0, "stop string 0 has 0 bytes"), "an empty stop string");
    fill(&v, toks, hs, sl);
    v.h.salt_len = 300;
    ok(refused(&v, 0, "tenant salt of 300 bytes"), "salt too long");
    fill(&v, toks, hs, sl);
    v.h.n_tokens = 0;
    v.h.n_block_hashes = 0;
    ok(refused(&v, 0, "prompt is empty"), "empty prompt");
    fill(&v, toks, hs, sl);
    m = msg(KVG_MSG_SUBMIT, &v.h, sizeof v.h - 4, payload, n);
    {
        char want[64];
        snprintf(want, sizeof want, "body of %zu bytes", sizeof v.h - 4);
        ok(kvg_proto_decode_submit(&m, &out, &id, err, sizeof err) != 0 && strstr(err, want),
           "short body: %s", err);
    }

    /* TOKENS */
    uint32_t ids[3] = { 5, 6, 7 };
    float lps[3] = { -0.5f, -1.0f, -2.0f };
    size_t tn = kvg_proto_encode_tokens(ids, lps, 3, "abc", 3, payload, sizeof payload);
    kvg_msg_tokens th = { KVG_PROTO_VERSION, KVG_TOKENS_LOGPROBS, 9, 1, 3, 3, 0 };
    m = msg(KVG_MSG_TOKENS, &th, sizeof th, payload, tn);
    kvg_tokens_view tv;
    ok(kvg_proto_decode_tokens(&m, &tv, err, sizeof err) == 0 && tv.ids[2] == 7 && tv.logprobs[1] == -1.0f &&
       memcmp(tv.text, "abc", 3) == 0, "TOKENS with logprobs round-trips");
    th.flags = 0;
    m = msg(KVG_MSG_TOKENS, &th, sizeof th, payload, tn);
    ok(kvg_proto_decode_tokens(&m, &tv, err, sizeof err) != 0, "TOKENS whose flags disagree with the payload: refused");
    /* ERROR */
    kvg_msg_error eh = { KVG_PROTO_VERSION, 429, 3, 4, 0 };
    m = msg(KVG_MSG_ERROR, &eh, sizeof eh, "busy", 4);
    const char *text;
    kvg_msg_error eo;
    ok(kvg_proto_decode_error(&m, &eo, &text, err, sizeof err) == 0 && eo.status == 429 &&
       memcmp(text, "busy", 4) == 0, "ERROR round-trips");
    eh.message_len = 5;
    m = msg(KVG_MSG_ERROR, &eh, sizeof eh, "busy", 4);
    ok(kvg_proto_decode_error(&m, &eo, &text, err, sizeof err) != 0, "ERROR with a wrong length: refused");
    /* fixed */
    kvg_msg_done dn = { KVG_PROTO_VERSION, 0, 8, 10, 4, 20, 0 }, dout;
    m = msg(KVG_MSG_DONE, &dn, sizeof dn, NULL, 0);
    ok(kvg_proto_decode_fixed(&m, KVG_MSG_DONE, &dout, sizeof dout, err, sizeof err) == 0 && dout.completion_tokens == 20,
       "DONE round-trips");
    ok(kvg_proto_decode_fixed(&m, KVG_MSG_ACCEPTED, &dout, sizeof(kvg_msg_accepted), err, sizeof err) != 0,
       "a DONE read as ACCEPTED: refused");
    m = msg(KVG_MSG_DONE, &dn, sizeof dn, payload, 8);
    ok(kvg_proto_decode_fixed(&m, KVG_MSG_DONE, &dout, sizeof dout, err, sizeof err) != 0,
       "DONE with a payload: refused");

    /* PAUSE / RESUME: fixed bodies, no payload, reserved 0; either type decodes */
    {
        kvg_msg_pause hh = { KVG_PROTO_VERSION, 0, 77 }, ho;
        int paused = -1;
        m = msg(KVG_MSG_PAUSE, &hh, sizeof hh, NULL, 0);
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) == 0 && paused == 1 && ho.request_id == 77,
           "PAUSE round-trips (id 77)");
        m = msg(KVG_MSG_RESUME, &hh, sizeof hh, NULL, 0);
        paused = -1;
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) == 0 && paused == 0 && ho.request_id == 77,
           "RESUME round-trips");
        hh.request_id = 0;
        m = msg(KVG_MSG_PAUSE, &hh, sizeof hh, NULL, 0);
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) == 0 && ho.request_id == 0,
           "PAUSE of id 0 decodes (no request has it: the engine ignores it)");
        hh.request_id = UINT64_MAX;
        m = msg(KVG_MSG_RESUME, &hh, sizeof hh, NULL, 0);
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) == 0 && ho.request_id == UINT64_MAX,
           "RESUME of id 2^64-1 decodes (unknown ids are the engine's to ignore)");
        m = msg(KVG_MSG_PAUSE, &hh, sizeof hh, payload, 8);
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) != 0 && strstr(err, "unexpected payload"),
           "PAUSE with a payload: refused (%s)", err);
        m = msg(KVG_MSG_PAUSE, &hh, sizeof hh - 4, NULL, 0);
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) != 0 && strstr(err, "body of 12 bytes"),
           "PAUSE with a short body: refused (%s)", err);
        m = msg(KVG_MSG_RESUME, &dn, sizeof dn, NULL, 0);
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) != 0, "RESUME with a long body: refused (%s)",
           err);
        hh.version = KVG_PROTO_VERSION + 1;
        m = msg(KVG_MSG_PAUSE, &hh, sizeof hh, NULL, 0);
        char want[64];
        snprintf(want, sizeof want, "protocol version %u", KVG_PROTO_VERSION + 1);
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) != 0 && strstr(err, want),
           "PAUSE of another protocol version: refused (%s)", err);
        hh.version = KVG_PROTO_VERSION;
        hh.reserved = 1;
        m = msg(KVG_MSG_RESUME, &hh, sizeof hh, NULL, 0);
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) != 0 && strstr(err, "reserved field 1"),
           "RESUME with a reserved field set: refused (%s)", err);
        hh.reserved = 0;
        m = msg(KVG_MSG_CANCEL, &hh, sizeof hh, NULL, 0);
        ok(kvg_proto_decode_pause(&m, &ho, &paused, err, sizeof err) != 0 && strstr(err, "expected a PAUSE message, got type 2"),
           "a CANCEL read as PAUSE: refused (%s)", err);
    }

    /* SAMPLES: a fixed body, no payload, reserved 0; draw and the mask are any value */
    {
        kvg_msg_samples sm = { KVG_PROTO_VERSION, 3, 55, 0x12u, 0 }, so;
        is_int(sizeof sm, 24, "SAMPLES body: 24 bytes");
        m = msg(KVG_MSG_SAMPLES, &sm, sizeof sm, NULL, 0);
        ok(kvg_proto_decode_samples(&m, &so, err, sizeof err) == 0 && so.draw == 3 && so.request_id == 55 &&
           so.cancel_mask == 0x12u, "SAMPLES round-trips (draw 3, id 55, mask 0x12)");
        sm.draw = UINT32_MAX;
        sm.cancel_mask = UINT32_MAX;
        m = msg(KVG_MSG_SAMPLES, &sm, sizeof sm, NULL, 0);
        ok(kvg_proto_decode_samples(&m, &so, err, sizeof err) == 0 && so.draw == UINT32_MAX,
           "SAMPLES with a huge draw and a full mask decodes (the engine clamps)");
        m = msg(KVG_MSG_SAMPLES, &sm, sizeof sm, payload, 8);
        ok(kvg_proto_decode_samples(&m, &so, err, sizeof err) != 0 && strstr(err, "unexpected payload"),
           "SAMPLES with a payload: refused (%s)", err);
        m = msg(KVG_MSG_SAMPLES, &sm, sizeof sm - 8, NULL, 0);
        ok(kvg_proto_decode_samples(&m, &so, err, sizeof err) != 0 && strstr(err, "body of 16 bytes"),
           "SAMPLES with a short body: refused (%s)", err);
        sm.reserved = 7;
        m = msg(KVG_MSG_SAMPLES, &sm, sizeof sm, NULL, 0);
        ok(kvg_proto_decode_samples(&m, &so, err, sizeof err) != 0 && strstr(err, "reserved field 7"),
           "SAMPLES with a reserved field set: refused (%s)", err);
        sm.reserved = 0;
        sm.version = KVG_PROTO_VERSION + 1;
        m = msg(KVG_MSG_SAMPLES, &sm, sizeof sm, NULL, 0);
        ok(kvg_proto_decode_samples(&m, &so, err, sizeof err) != 0 && strstr(err, "protocol version"),
           "SAMPLES of another protocol version: refused (%s)", err);
        sm.version = KVG_PROTO_VERSION;
        m = msg(KVG_MSG_PAUSE, &sm, sizeof sm, NULL, 0);
        ok(kvg_proto_decode_samples(&m, &so, err, sizeof err) != 0 && strstr(err, "expected a SAMPLES message"),
           "a PAUSE read as SAMPLES: refused (%s)", err);
    }

    /* WIPE: a fixed body, the salt as its payload (0..KVG_PROTO_MAX_SALT bytes, exactly
     * salt_len), id != 0, flags and reserved 0; WIPED: fixed, no payload, reserved 0 */
    {
        kvg_msg_wipe wh = { KVG_PROTO_VERSION, 0, 91, 4, 0 }, wo;
        const uint8_t *salt = NULL;
        is_int(sizeof wh, 24, "WIPE body: 24 bytes");
        memcpy(payload, "acme", 4);
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, 4);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) == 0 && id == 91 && wo.salt_len == 4 &&
           salt == payload && memcmp(salt, "acme", 4) == 0, "WIPE round-trips (id 91, salt \"acme\")");
        /* a default tenant's salt starts with a NUL: bytes, not a string */
        static const uint8_t dsalt[5] = { 0, 'a', 'n', 'o', 'n' };
        memcpy(payload, dsalt, 5);
        wh.salt_len = 5;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, 5);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) == 0 && memcmp(salt, dsalt, 5) == 0,
           "WIPE of a default tenant's salt (0x00 + name) round-trips");
        wh.salt_len = 0;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, NULL, 0);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) == 0 && wo.salt_len == 0,
           "WIPE of the empty salt decodes (what SUBMIT may carry too)");
        wh.salt_len = KVG_PROTO_MAX_SALT;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, KVG_PROTO_MAX_SALT);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) == 0, "WIPE of a %d-byte salt decodes",
           KVG_PROTO_MAX_SALT);
        wh.salt_len = KVG_PROTO_MAX_SALT + 1;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, KVG_PROTO_MAX_SALT + 1);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) != 0 && strstr(err, "at most 256") &&
           id == 91, "WIPE of a longer salt: refused, naming the request (%s)", err);
        wh.salt_len = 4;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, 8);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) != 0 &&
           strstr(err, "payload of 8 bytes for a salt of 4"), "WIPE whose payload is not its salt: refused (%s)",
           err);
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, 3);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) != 0, "WIPE with a short payload: refused");
        wh.request_id = 0;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, 4);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) != 0 && strstr(err, "request id 0"),
           "WIPE with id 0: refused (%s)", err);
        wh.request_id = 91;
        wh.flags = 1;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, 4);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) != 0 && strstr(err, "must be 0"),
           "WIPE with a flag set: refused (%s)", err);
        wh.flags = 0;
        wh.reserved = 2;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, 4);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) != 0 && strstr(err, "reserved 2"),
           "WIPE with a reserved field set: refused (%s)", err);
        wh.reserved = 0;
        wh.version = KVG_PROTO_VERSION - 1;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh, payload, 4);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) != 0 && strstr(err, "protocol version") &&
           id == 0, "WIPE of the previous protocol version: refused (%s)", err);
        wh.version = KVG_PROTO_VERSION;
        m = msg(KVG_MSG_WIPE, &wh, sizeof wh - 8, payload, 4);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) != 0 && strstr(err, "body of 16 bytes"),
           "WIPE with a short body: refused (%s)", err);
        m = msg(KVG_MSG_SUBMIT, &wh, sizeof wh, payload, 4);
        ok(kvg_proto_decode_wipe(&m, &wo, &salt, &id, err, sizeof err) != 0 && strstr(err, "expected a WIPE"),
           "a SUBMIT read as WIPE: refused (%s)", err);

        kvg_msg_wiped dh = { KVG_PROTO_VERSION, 0, 91, 3, (uint64_t)1 << 40, 7 }, d2;
        is_int(sizeof dh, 40, "WIPED body: 40 bytes");
        m = msg(KVG_MSG_WIPED, &dh, sizeof dh, NULL, 0);
        ok(kvg_proto_decode_wiped(&m, &d2, err, sizeof err) == 0 && d2.request_id == 91 && d2.pool_blocks == 3 &&
           d2.host_blocks == (uint64_t)1 << 40 && d2.disk_blocks == 7, "WIPED round-trips (3, 2^40, 7 blocks)");
        m = msg(KVG_MSG_WIPED, &dh, sizeof dh, payload, 8);
        ok(kvg_proto_decode_wiped(&m, &d2, err, sizeof err) != 0 && strstr(err, "unexpected payload"),
           "WIPED with a payload: refused (%s)", err);
        dh.reserved = 1;
        m = msg(KVG_MSG_WIPED, &dh, sizeof dh, NULL, 0);
        ok(kvg_proto_decode_wiped(&m, &d2, err, sizeof err) != 0 && strstr(err, "reserved field 1"),
           "WIPED with a reserved field set: refused (%s)", err);
        dh.reserved = 0;
        m = msg(KVG_MSG_DONE, &dh, sizeof dh, NULL, 0);
        ok(kvg_proto_decode_wiped(&m, &d2, err, sizeof err) != 0 && strstr(err, "expected a WIPED"),
           "a DONE read as WIPED: refused (%s)", err);
        ok(KVG_PROTO_VERSION >= 8, "protocol version %u carries WIPE (8 introduced it)", KVG_PROTO_VERSION);
    }

    /* statistics page */
    static kvg_stats_page page;
    kvg_stats s, r;
    memset(&s, 0, sizeof s);
    ok(kvg_stats_read(&page, &r) == -1, "an unwritten page is not a stats page");
    s.magic = KVG_STATS_MAGIC;
    s.hit_tokens = 1234;
    s.samples_started = 5;
    s.samples_cancelled = 2;
    s.samples_dropped = 1;
    snprintf(s.tenant[0].name, sizeof s.tenant[0].name, "acme");
    kvg_stats_write(&page, &s);
    ok(kvg_stats_read(&page, &r) == 0 && r.hit_tokens == 1234 && strcmp(r.tenant[0].name, "acme") == 0 &&
       r.samples_started == 5 && r.samples_cancelled == 2 && r.samples_dropped == 1 &&
       atomic_load(&page.seq) == 2, "the page reads back what was written (seq 2)");
    return done_testing();
}
