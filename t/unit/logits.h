/* Reading logit rows in tests and benches: the greedy choice, log-probabilities, and how
 * far the choice is from its runner-up. */
#ifndef KVG_T_LOGITS_H
#define KVG_T_LOGITS_H

#include <math.h>

/* The index of the largest of v[0..n) (the first on ties: greedy decoding's choice). */
__attribute__((unused)) static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* log_softmax of one row, in double: out[i] = x[i] - log(sum exp x). */
__attribute__((unused)) static void log_softmax(const float *x, int n, double *out)
{
    double mx = x[0], sum = 0.0;
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++)
        sum += exp((double)x[i] - mx);
    for (int i = 0; i < n; i++)
        out[i] = (double)x[i] - mx - log(sum);
}

/* The largest value of x minus the second largest. */
__attribute__((unused)) static double top2_gap(const double *x, int n)
{
    double a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) {
            b = a;
            a = x[i];
        } else if (x[i] > b) {
            b = x[i];
        }
    }
    return a - b;
}

#endif
