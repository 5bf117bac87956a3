/* Sampling. All arithmetic on probabilities is in double, in a fixed order (ids
 * ascending, or the candidates' total order), so the same logits and parameters always
 * give the same token and logprob. */
#include "sampler.h"
#include "sampler_testing.h"
#include "errmsg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvg_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

double kvg_sample_uniform(uint64_t seed, uint64_t sample_index, uint64_t position)
{
    uint32_t ctr[4] = { (uint32_t)sample_index, (uint32_t)(sample_index >> 32),
                        (uint32_t)position, (uint32_t)(position >> 32) };
    uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
    uint32_t o[4];
    uint64_t bits;
    kvg_philox4x32(ctr, key, o);
    bits = (((uint64_t)o[0] << 32) | o[1]) >> 11;
    return (double)bits * (1.0 / 9007199254740992.0);
}

void kvg_sampler_free(kvg_sampler *s)
{
    if (!s)
        return;
    free(s->ids);
    free(s->e);
    memset(s, 0, sizeof *s);
}

int kvg_sampler_params_check(const kvg_sampler_params *p, char *err, size_t err_len)
{
    if (!(p->temperature >= 0.0f) || isinf(p->temperature)) {
        kvg_set_err(err, err_len, "temperature must be a finite number >= 0 (got %g)", (double)p->temperature);
        return -1;
    }
    if (p->top_k < 0) {
        kvg_set_err(err, err_len, "top_k must be >= 0 (got %d)", p->top_k);
        return -1;
    }
    if (isnan(p->top_p)) {
        kvg_set_err(err, err_len, "top_p must be a number in (0, 1]");
        return -1;
    }
    return 0;
}

static inline float val_of(float v)
{
    return isnan(v) ? -INFINITY : v;
}

int32_t kvg_argmax(const float *logits, int vocab)
{
    int32_t best = 0;
    float bv;
    if (vocab <= 0)
        return -1;
    bv = val_of(logits[0]);
    for (int i = 1; i < vocab; i++) {
        float v = val_of(logits[i]);
        if (v > bv) {
            bv = v;
            best = i;
        }
    }
    return best;
}

/* The candidates' total order: higher value first, then lower id. */
static inline int before(float va, int32_t ia, float vb, int32_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

static int cand_cmp(const void *a, const void *b, void *ctx)
{
    const float *v = ctx;
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    if (before(val_of(v[ia]), ia, val_of(v[ib]), ib))
        return -1;
    return ia == ib ? 0 : 1;
}

/* Min-heap (by the total order, "worst" on top) holding the best k ids seen. */
static void heap_sift_down(int32_t *h, int n, int i, const float *v)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && before(val_of(v[h[w]]), h[w], val_of(v[h[l]]), h[l]))
            w = l;
        if (r < n && before(val_of(v[h[w]]), h[w], val_of(v[h[r]]), h[r]))
            w = r;
        if (w == i)
            return;
        int32_t t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

static void heap_sift_up(int32_t *h, int i, const float *v)
{
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!before(val_of(v[h[parent]]), h[parent], val_of(v[h[i]]), h[i]))
            return;
        int32_t t = h[i]; h[i] = h[parent]; h[parent] = t;
        i = parent;
    }
}

/* The best k ids of logits in the total order, sorted best first, into ids. */
static int top_k_ids(const float *logits, int vocab, int k, int32_t *ids)
{
    int n = 0;
    for (int32_t i = 0; i < vocab; i++) {
        if (n < k) {
            ids[n] = i;
            heap_sift_up(ids, n, logits);
            n++;
        } else if (before(val_of(logits[i]), i, val_of(logits[ids[0]]), ids[0])) {
            ids[0] = i;
            heap_sift_down(ids, n, 0, logits);
        }
    }
    qsort_r(ids, (size_t)n, sizeof *ids, cand_cmp, (void *)logits);
    return n;
}

static int ensure_cap(kvg_sampler *s, int vocab)
{
    if (s->cap >= vocab)
        return 0;
    int32_t *ids = realloc(s->ids, (size_t)vocab * sizeof *ids);
    if (!ids)
        return -1;
    s->ids = ids;
    double *e = realloc(s->e, (size_t)vocab * sizeof *e);
    if (!e)
        return -1;
    s->e = e;
    s->cap = vocab;
    return 0;
}

double kvg_top2_gap(const float *logits, int vocab)
{
    double a = -INFINITY, b = -INFINITY;     /* the best and the second best */
    if (vocab < 2)
        return INFINITY;
    for (int i = 0; i < vocab; i++) {
        double v = (double)val_of(logits[i]);
        if (v > a) {
            b = a;
            a = v;
        } else if (v > b) {
            b = v;
        }
    }
    return isinf(b) && isinf(a) ? 0.0 : a - b;
}

int32_t kvg_sample(kvg_sampler *s, const kvg_sampler_params *p, const float *logits, int vocab,
                   uint64_t sample_index, uint64_t position, float *logprob)
{
    double t, maxv, total = 0.0;
    int32_t choice = -1;
    int greedy;

    if (vocab <= 0)
        return -1;
    greedy = !(p->temperature > 0.0f);
    if (greedy && !logprob)
        return kvg_argmax(logits, vocab);
    t = greedy ? 1.0 : (double)p->temperature;
    maxv = (double)val_of(logits[kvg_argmax(logits, vocab)]) / t;
    if (isinf(maxv)) {
        /* All -inf/NaN: nothing to weigh; the lowest id by the total order. */
        if (logprob)
            *logprob = -INFINITY;
        return 0;
    }
    /* Softmax mass of logits/T over the whole vocabulary, ids ascending. Sampling
     * keeps each weight for its later passes. */
    if (greedy) {
        for (int i = 0; i < vocab; i++)
            total += exp((double)val_of(logits[i]) / t - maxv);
    } else {
        if (ensure_cap(s, vocab) != 0)
            return -1;
        for (int i = 0; i < vocab; i++) {
            s->e[i] = exp((double)val_of(logits[i]) / t - maxv);
            total += s->e[i];
        }
    }

    if (greedy) {
        choice = kvg_argmax(logits, vocab);
    } else {
        int k = p->top_k > 0 && p->top_k < vocab ? p->top_k : vocab;
        int use_p = p->top_p > 0.0f && p->top_p < 1.0f;
        double u = kvg_sample_uniform(p->seed, sample_index, position);
        if (k == vocab && !use_p) {
            double target = u * total, cum = 0.0;
            for (int i = 0; i < vocab; i++) {
                double e = s->e[i];
                if (e <= 0.0)
                    continue;
                cum += e;
                choice = i;
                if (target < cum)
                    break;
            }
        } else {
            int n;
            double mass = 0.0, target, cum = 0.0;
            if (k < vocab) {
                n = top_k_ids(logits, vocab, k, s->ids);
            } else {
                /* top-p alone: a token other than the most likely one whose probability
                 * is below (1-p)/(V-1) cannot be in the nucleus (it and everything after
                 * it weigh less than 1-p), so only the others need sorting. The most
                 * likely tokens (e == 1) always stay: for p < 1/V they may be below. */
                double cut = vocab > 1 ? (1.0 - (double)p->top_p) / (double)(vocab - 1) * total : 0.0;
                n = 0;
                for (int32_t i = 0; i < vocab; i++) {
                    double e = s->e[i];
                    if (e >= cut || e >= 1.0)
                        s->ids[n++] = i;
                }
                qsort_r(s->ids, (size_t)n, sizeof *s->ids, cand_cmp, (void *)logits);
            }
            /* Probabilities renormalised over the candidates, best first. */
            for (int i = 0; i < n; i++)
                mass += s->e[s->ids[i]];
            if (use_p) {
                /* The smallest prefix whose mass reaches top_p of the distribution being
                 * truncated (the top-k one, else the whole vocabulary); acc then sums
                 * exactly the kept candidates in the same order. */
                double need = (double)p->top_p * (k < vocab ? mass : total), acc = 0.0;
                int keep = n;
                for (int i = 0; i < n; i++) {
                    acc += s->e[s->ids[i]];
                    if (acc >= need) {
                        keep = i + 1;
                        break;
                    }
                }
                n = keep;
                mass = acc;
            }
            target = u * mass;
            for (int i = 0; i < n; i++) {
                double e = s->e[s->ids[i]];
                if (e <= 0.0 && choice >= 0)
                    continue;
                cum += e;
                choice = s->ids[i];
                if (target < cum)
                    break;
            }
        }
    }
    if (logprob)
        *logprob = (float)((double)val_of(logits[choice]) / t - maxv - log(total));
    return choice;
}
