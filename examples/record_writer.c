/* An engine outside Python logging its rounds for `specsample audit`: JSON Lines, printf only.
 *
 * A toy speculative sampler over V = 8 tokens with fixed draft and target rows (q, p), k = 4 drafts a
 * round, the standard rule: accept draft x while u < p(x) / q(x), at the first rejection emit a token
 * from norm(max(0, p - q)), after k acceptances a bonus token from p. Each round is written as one JSON
 * object with the record format's compact fields (docs/records.md), after a header line.
 *
 *   cc -O2 -o record_writer examples/record_writer.c -lm
 *   ./record_writer 20000 rounds.jsonl && specsample audit rounds.jsonl            # PASS
 *   cc -O2 -DBONUS_FROM_Q -o broken examples/record_writer.c -lm
 *   ./broken 20000 broken.jsonl && specsample audit broken.jsonl                   # FAIL, stage: bonus
 *
 * The broken twin draws the bonus from q instead of p and logs what the rule says it must follow (p),
 * as a real bug would: the audit names the bonus stage.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define V 8
#define K 4

static const double q[V] = {0.30, 0.05, 0.10, 0.15, 0.02, 0.18, 0.12, 0.08};
static const double p[V] = {0.10, 0.20, 0.05, 0.25, 0.10, 0.05, 0.15, 0.10};

static uint64_t state = 0x9E3779B97F4A7C15ull;

static double uniform(void) { /* xorshift64*: 53 bits in [0, 1) */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return (double)((state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}

static int draw(const double *w, double total) { /* inverse CDF over weights summing to total */
    double u = uniform() * total, c = 0.0;
    int last = 0;
    for (int t = 0; t < V; t++) {
        if (w[t] <= 0) continue;
        last = t;
        c += w[t];
        if (u < c) return t;
    }
    return last;
}

static void cdf(const double *w, double total, int y, double *lo, double *hi) {
    double c = 0.0;
    for (int t = 0; t < y; t++) c += w[t];
    *lo = c / total;
    *hi = (c + w[y]) / total;
}

/* the same interval with the tokens in their own probability-rank order (most probable first, ties by id) */
static void rank(const double *w, double total, int y, double *lo, double *hi) {
    double c = 0.0;
    for (int t = 0; t < V; t++)
        if (w[t] > w[y] || (w[t] == w[y] && t < y)) c += w[t];
    *lo = c / total;
    *hi = (c + w[y]) / total;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 10000;
    FILE *out = argc > 2 ? fopen(argv[2], "w") : stdout;
    if (!out) return 2;
    double res[V], rtotal = 0.0;
    for (int t = 0; t < V; t++) {
        res[t] = p[t] > q[t] ? p[t] - q[t] : 0.0;
        rtotal += res[t];
    }
    fprintf(out, "{\"specsample.record\": \"2\", \"specsample.rule\": \"standard\"}\n");
    for (long r = 0; r < rounds; r++) {
        int drafts[K], emitted[K + 1], n = 0, j = 0;
        for (int i = 0; i < K; i++) drafts[i] = draw(q, 1.0);
        while (j < K && uniform() < p[drafts[j]] / q[drafts[j]]) emitted[n++] = drafts[j++];
        double lo, hi, rlo, rhi;
        if (j < K) { /* a rejection: the residual */
            int y = draw(res, rtotal);
            emitted[n++] = y;
            cdf(res, rtotal, y, &lo, &hi);
            rank(res, rtotal, y, &rlo, &rhi);
        } else { /* the bonus, from p (the broken twin: from q) */
#ifdef BONUS_FROM_Q
            int y = draw(q, 1.0);
#else
            int y = draw(p, 1.0);
#endif
            emitted[n++] = y;
            cdf(p, 1.0, y, &lo, &hi);
            rank(p, 1.0, y, &rlo, &rhi);
        }
        fprintf(out, "{\"request_id\": \"c-%ld\", \"round\": 0, \"k\": %d, \"drafts\": [", r, K);
        for (int i = 0; i < K; i++) fprintf(out, "%s%d", i ? ", " : "", drafts[i]);
        fprintf(out, "], \"emitted\": [");
        for (int i = 0; i < n; i++) fprintf(out, "%s%d", i ? ", " : "", emitted[i]);
        const char *names[6] = {"q_draft", "p_draft", "q_cdf_lo", "q_cdf_hi", "q_rank_lo", "q_rank_hi"};
        for (int f = 0; f < 6; f++) {
            fprintf(out, "], \"%s\": [", names[f]);
            for (int i = 0; i < K; i++) {
                double a, b, ra, rb, v;
                cdf(q, 1.0, drafts[i], &a, &b);
                rank(q, 1.0, drafts[i], &ra, &rb);
                v = f == 0 ? q[drafts[i]] : f == 1 ? p[drafts[i]] : f == 2 ? a : f == 3 ? b : f == 4 ? ra : rb;
                fprintf(out, "%s%.17g", i ? ", " : "", v);
            }
        }
        fprintf(out, "], \"stop_cdf_lo\": %.17g, \"stop_cdf_hi\": %.17g, \"stop_rank_lo\": %.17g, "
                "\"stop_rank_hi\": %.17g}\n", lo, hi, rlo, rhi);
    }
    if (out != stdout) fclose(out);
    return 0;
}
