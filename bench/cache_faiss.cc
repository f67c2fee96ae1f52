// cache_faiss.cc — the semantic lookup through Debian's libfaiss-dev, for
// comparison with cache/'s own int8 index (bench/cache_bench.c): the same
// shape of data (clustered unit vectors, N entries, paraphrase queries at
// cosine 0.951..0.99 and fresh ones), one thread, p50/p99 of one query's
// search. Indexes: flat float inner product (exact), SQ8 (int8 scalar
// quantiser, flat scan: faiss's counterpart of ours) and HNSW (graph,
// approximate). Built only by bench/cache_bench.sh; sluice never links it.
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexScalarQuantizer.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <vector>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double rnd()
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

static long long cpu_ns()
{
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void unit(float *v, size_t d)
{
    double ss = 0;
    for (size_t i = 0; i < d; i++)
        ss += (double)v[i] * v[i];
    for (size_t i = 0; i < d; i++)
        v[i] = (float)(v[i] / std::sqrt(ss));
}

static void at_cos(const float *u, double c, float *q, size_t d)
{
    std::vector<float> w(d);
    for (size_t i = 0; i < d; i++)
        w[i] = (float)rnd();
    double dp = 0;
    for (size_t i = 0; i < d; i++)
        dp += (double)w[i] * u[i];
    for (size_t i = 0; i < d; i++)
        w[i] = (float)(w[i] - dp * u[i]);
    unit(w.data(), d);
    double s = std::sqrt(1 - c * c);
    for (size_t i = 0; i < d; i++)
        q[i] = (float)(c * u[i] + s * w[i]);
}

static void run(const char *name, faiss::Index *idx, const std::vector<float> &data, size_t n,
                size_t d, int queries, long long build_ns)
{
    std::vector<float> center(d), v(d);
    rng = 0x1234567ull;
    for (size_t i = 0; i < d; i++)
        center[i] = (float)rnd();
    std::vector<long long> lat(queries);
    int hits = 0, right = 0, fresh_hits = 0;
    for (int q = 0; q < queries; q++) {
        bool dup = q % 2 == 0;
        size_t target = (size_t)q % 1000;
        if (dup) {
            at_cos(&data[target * d], 0.951 + 0.039 * (rnd() + 1) / 2, v.data(), d);
        } else {
            for (size_t i = 0; i < d; i++)
                v[i] = (float)(center[i] + rnd());
            unit(v.data(), d);
        }
        float dist;
        faiss::Index::idx_t label;
        long long t0 = cpu_ns();
        idx->search(1, v.data(), 1, &dist, &label);
        lat[q] = cpu_ns() - t0;
        bool hit = label >= 0 && dist >= 0.95f;
        hits += hit && dup;
        right += hit && dup && (size_t)label == target;
        fresh_hits += hit && !dup;
    }
    std::sort(lat.begin(), lat.end());
    std::printf("faiss %-6s n=%zu dim=%-4zu p50 %.3f ms p99 %.3f ms (build %.1f s) | paraphrases "
                "hit %d/%d right %d; fresh false hits %d\n",
                name, n, d, lat[queries / 2] / 1e6, lat[queries * 99 / 100] / 1e6, build_ns / 1e9,
                hits, queries / 2, right, fresh_hits);
}

int main(int argc, char **argv)
{
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    size_t n = argc > 1 ? (size_t)std::atol(argv[1]) : 100000;
    int queries = argc > 2 ? std::atoi(argv[2]) : 400;
    size_t dims[] = {384, 1024};
    std::printf("faiss (Debian libfaiss-dev %s), one thread\n", "1.7.3");
    for (size_t d : dims) {
        rng = 0x1234567ull;
        std::vector<float> center(d), data(n * d);
        for (size_t i = 0; i < d; i++)
            center[i] = (float)rnd();
        for (size_t k = 0; k < n; k++) {
            for (size_t i = 0; i < d; i++)
                data[k * d + i] = (float)(center[i] + rnd());
            unit(&data[k * d], d);
        }
        {
            long long t0 = cpu_ns();
            faiss::IndexFlatIP flat(d);
            flat.add(n, data.data());
            run("flat", &flat, data, n, d, queries, cpu_ns() - t0);
        }
        {
            long long t0 = cpu_ns();
            faiss::IndexScalarQuantizer sq(d, faiss::ScalarQuantizer::QT_8bit,
                                           faiss::METRIC_INNER_PRODUCT);
            sq.train(n, data.data());
            sq.add(n, data.data());
            run("sq8", &sq, data, n, d, queries, cpu_ns() - t0);
        }
        // Debian's HNSW build is single-threaded here and slow (~90 s for 10k
        // vectors on this machine): only at small N.
        if (d == 384 && n <= 20000) {
            long long t0 = cpu_ns();
            faiss::IndexHNSWFlat hnsw(d, 32, faiss::METRIC_INNER_PRODUCT);
            hnsw.hnsw.efSearch = 64;
            hnsw.add(n, data.data());
            run("hnsw", &hnsw, data, n, d, queries, cpu_ns() - t0);
        }
    }
    return 0;
}
