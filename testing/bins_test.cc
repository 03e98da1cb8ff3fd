// bins_test: reproducible mode's binned accumulators (ctxpar_bins.h) on the CPU device, through
// the dispatch's ctxpar_dev_bins_* wrappers, with 1 and 3 threads: sums whose bits (finished
// values and raw blocks) do not depend on the order of the terms nor on how blocks are merged,
// against an exact oracle written here (a fixed-point big integer, Kulisch style), the attention
// partials against a direct long double computation, non-finite terms, and the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "ctxpar_bins.h"
#include "ctxpar_cpu.h"
#include "dispatch.h"

namespace {

// ---------------------------------------------------------------- the exact oracle

// Σ x_j 2^k_j exactly: 32-bit digits (held in int64 so that a few thousand terms need no carry)
// of a fixed-point number whose bit kOff has weight 2^0.
class Exact {
  public:
    static constexpr int kLimbs = 80; // 2560 bits
    static constexpr int kOff = 1280;

    void Add(double x, int k = 0) {
        ASSERT_TRUE(std::isfinite(x));
        if (x == 0.0)
            return;
        int e;
        const double m = std::frexp(x, &e); // x = m 2^e, 1/2 <= |m| < 1
        const int64_t mi = (int64_t)std::ldexp(m, 53);
        const int p = e - 53 + k + kOff; // bit of mi's lowest bit
        ASSERT_GE(p, 0);
        ASSERT_LT(p / 32 + 3, kLimbs - 2);
        const unsigned __int128 v = (unsigned __int128)(uint64_t)(mi < 0 ? -mi : mi) << (p % 32);
        for (int j = 0; j < 3; j++) {
            const int64_t digit = (int64_t)(uint32_t)(v >> (32 * j));
            d_[p / 32 + j] += mi < 0 ? -digit : digit;
        }
    }

    // The sum rounded to float, to nearest even (subnormals, overflow to infinity included).
    float ToFloat() const {
        int64_t c[kLimbs];
        std::memcpy(c, d_, sizeof c);
        Normalise(c);
        const bool neg = c[kLimbs - 1] < 0;
        if (neg) {
            for (int64_t &x : c)
                x = -x;
            Normalise(c);
        }
        int top = -1;
        for (int i = kLimbs - 1; i >= 0 && top < 0; i--)
            if (c[i])
                top = i * 32 + 63 - __builtin_clzll((uint64_t)c[i]);
        if (top < 0)
            return 0.0f;
        auto bit = [&](int i) { return i < 0 ? 0 : (int)((c[i / 32] >> (i % 32)) & 1); };
        const int cut = std::max(top - 23, kOff - 149); // lowest bit a float keeps
        uint64_t q = 0;
        for (int i = top; i >= cut; i--)
            q = 2 * q + (uint64_t)bit(i);
        const int round = bit(cut - 1);
        bool sticky = false;
        for (int i = cut - 2; i >= 0 && !sticky; i--) {
            if (i % 32 == 31 && c[i / 32] == 0) { // a whole zero digit
                i -= 31;
                continue;
            }
            sticky = bit(i);
        }
        if (round && (sticky || (q & 1)))
            q++;
        const float r = (float)std::ldexp((double)q, cut - kOff); // exact, or beyond: infinity
        return neg ? -r : r;
    }

  private:
    static void Normalise(int64_t *c) {
        for (int i = 0; i + 1 < kLimbs; i++) {
            const int64_t low = c[i] & 0xffffffff;
            const int64_t carry = (c[i] - low) / ((int64_t)1 << 32);
            c[i] = low;
            c[i + 1] += carry;
        }
    }
    int64_t d_[kLimbs] = {};
};

// ---------------------------------------------------------------- harness

struct Device {
    ctxpar_device *dev = nullptr;
    explicit Device(int threads) {
        ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
        opt.num_threads = threads;
        EXPECT_EQ(ctxpar_device_create_cpu(&opt, &dev), CTXPAR_OK) << ctxpar_last_error();
    }
    ~Device() { ctxpar_device_destroy(dev); }
    Device(const Device &) = delete;
    Device &operator=(const Device &) = delete;
};

// A block of rows x width values in host memory (the CPU device's memory), cleared.
struct Block {
    int64_t rows, width;
    std::vector<uint64_t> mem; // 8-byte aligned
    Block(ctxpar_device *dev, int64_t r, int64_t w)
        : rows(r), width(w), mem(ctxpar_bins_bytes(r, w) / 8 + 1, 0x5a5a5a5a5a5a5a5aull) {
        EXPECT_EQ(ctxpar_dev_bins_clear(dev, Data(), rows, width, nullptr), CTXPAR_OK)
            << ctxpar_last_error();
    }
    void *Data() { return mem.data(); }
    bool SameBits(const Block &o) const {
        return std::memcmp(mem.data(), o.mem.data(), ctxpar_bins_bytes(rows, width)) == 0;
    }
};

std::vector<float> Finish(ctxpar_device *dev, Block &b) {
    std::vector<float> out((size_t)(b.rows * b.width), -7.0f);
    EXPECT_EQ(ctxpar_dev_bins_finish(dev, b.Data(), b.rows, b.width, out.data(), nullptr),
              CTXPAR_OK)
        << ctxpar_last_error();
    return out;
}

bool SameFloats(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Merges blocks [0, n) into one, in one of several trees; returns the index holding the result.
void MergeTree(ctxpar_device *dev, std::vector<Block> &blocks, int tree) {
    const int64_t rows = blocks[0].rows, width = blocks[0].width;
    const size_t n = blocks.size();
    auto merge = [&](size_t to, size_t from) {
        ASSERT_EQ(ctxpar_dev_bins_merge(dev, blocks[to].Data(), blocks[from].Data(), rows, width,
                                        nullptr),
                  CTXPAR_OK)
            << ctxpar_last_error();
    };
    if (tree == 0) { // left to right into 0
        for (size_t i = 1; i < n; i++)
            merge(0, i);
    } else if (tree == 1) { // right to left into n - 1, then moved to 0 by a merge into empty
        for (size_t i = n - 1; i-- > 0;)
            merge(n - 1, i);
        Block empty(dev, rows, width);
        blocks[0] = empty;
        merge(0, n - 1);
    } else { // pairwise
        for (size_t step = 1; step < n; step *= 2)
            for (size_t i = 0; i + step < n; i += 2 * step)
                merge(i, i + step);
    }
}

// One random float term of exponent in [emin, emax] (subnormals where emin < -126).
float RandomFloat(std::mt19937_64 &rng, int emin, int emax) {
    const int e = std::uniform_int_distribution<int>(emin, emax)(rng);
    const double m = 1.0 + std::ldexp((double)(rng() >> 40), -24); // 24 bits
    float x = (float)std::ldexp(m, e);
    return rng() & 1 ? -x : x;
}

// The terms of one value, by kind:
//   0: wide (exponents -149 .. 127, led by one large positive term: no heavy cancellation)
//   1: narrow (exponents within 40 of each other: nothing truncated), random signs
//   2: narrow with exact cancellation (every term but a few also comes negated)
//   3: subnormals and the smallest normals
//   4: near FLT_MAX, all positive: overflows to +inf
//   5: wide with cancelling pairs at every scale
std::vector<float> Terms(std::mt19937_64 &rng, int kind, int n) {
    std::vector<float> t;
    const int e0 = std::uniform_int_distribution<int>(-100, 80)(rng);
    switch (kind) {
    case 0:
        t.push_back(std::ldexp(1.5f, 127));
        while ((int)t.size() < n)
            t.push_back(RandomFloat(rng, -149, 118));
        break;
    case 1:
        while ((int)t.size() < n)
            t.push_back(RandomFloat(rng, e0 - 40, e0));
        break;
    case 2:
        for (int i = 0; i < 5; i++)
            t.push_back(RandomFloat(rng, e0 - 40, e0 - 30));
        while ((int)t.size() + 1 < n) {
            const float x = RandomFloat(rng, e0 - 40, e0);
            t.push_back(x);
            t.push_back(-x);
        }
        break;
    case 3:
        while ((int)t.size() < n)
            t.push_back(RandomFloat(rng, -149, -125));
        break;
    case 4:
        while ((int)t.size() < n)
            t.push_back(std::fabs(RandomFloat(rng, 120, 127)));
        break;
    default:
        t.push_back(std::ldexp(-1.25f, 100));
        while ((int)t.size() + 1 < n) {
            const float x = RandomFloat(rng, -149, 90);
            t.push_back(x);
            t.push_back(-x);
        }
        break;
    }
    while ((int)t.size() < n)
        t.push_back(0.0f);
    return t;
}

// Whether got is within one ulp of want (float).
bool WithinUlp(float got, float want) {
    return got == want || got == std::nextafter(want, INFINITY) ||
           got == std::nextafter(want, -INFINITY);
}

// ---------------------------------------------------------------- (a), (b): plain sums

constexpr int64_t kB = 2, kS = 3, kH = 2, kW = 6; // 12 rows of 6 values: one of each kind
constexpr int64_t kRows = kB * kS * kH, kValues = kRows * kW;
constexpr int kTerms = 2000;

// terms[v][j]: value v's term j. A "call" j sends one term per value; perm[v] orders value v's
// terms; call j goes to block part[j].
struct Plan {
    std::vector<std::vector<int>> perm; // [value][call] -> term
    std::vector<int> part;              // [call] -> block
    int blocks, tree;
    bool split_rows; // each call as two bins_add of rows [0, 1) and [1, seq)
};

Block RunPlan(ctxpar_device *dev, const std::vector<std::vector<float>> &terms, const Plan &p) {
    std::vector<Block> blocks;
    for (int i = 0; i < p.blocks; i++)
        blocks.emplace_back(dev, kRows, kW);
    std::vector<float> src((size_t)kValues);
    for (int j = 0; j < kTerms; j++) {
        for (int64_t v = 0; v < kValues; v++) // src is [B, S, H, W]: value v is block value v
            src[(size_t)v] = terms[(size_t)v][(size_t)p.perm[(size_t)v][(size_t)j]];
        Block &blk = blocks[(size_t)p.part[(size_t)j]];
        if (!p.split_rows) {
            const ctxpar_bins_shape sh = {kB, kS, kH, kW, 0, kS};
            EXPECT_EQ(ctxpar_dev_bins_add(dev, blk.Data(), src.data(), &sh, nullptr), CTXPAR_OK)
                << ctxpar_last_error();
            continue;
        }
        for (int64_t off : {(int64_t)0, (int64_t)1}) {
            const int64_t len = off ? kS - 1 : 1;
            std::vector<float> part;
            for (int64_t b = 0; b < kB; b++)
                for (int64_t s = off; s < off + len; s++)
                    for (int64_t i = 0; i < kH * kW; i++)
                        part.push_back(src[(size_t)((b * kS + s) * kH * kW + i)]);
            const ctxpar_bins_shape sh = {kB, kS, kH, kW, off, len};
            EXPECT_EQ(ctxpar_dev_bins_add(dev, blk.Data(), part.data(), &sh, nullptr), CTXPAR_OK)
                << ctxpar_last_error();
        }
    }
    MergeTree(dev, blocks, p.tree);
    return blocks[0];
}

TEST(Bins, SumsIndependentOfOrderAndExact) {
    std::mt19937_64 rng(20261207);
    std::vector<std::vector<float>> terms;
    for (int64_t v = 0; v < kValues; v++)
        terms.push_back(Terms(rng, (int)(v % kW), kTerms));
    // The oracle.
    std::vector<float> want((size_t)kValues);
    for (int64_t v = 0; v < kValues; v++) {
        Exact e;
        for (float x : terms[(size_t)v])
            e.Add(x);
        want[(size_t)v] = e.ToFloat();
    }
    std::vector<Plan> plans;
    for (int i = 0; i < 5; i++) {
        Plan p;
        p.blocks = i == 0 ? 1 : 2 + i;
        p.tree = i % 3;
        p.split_rows = i % 2 == 1;
        for (int64_t v = 0; v < kValues; v++) {
            std::vector<int> o(kTerms);
            for (int j = 0; j < kTerms; j++)
                o[(size_t)j] = j;
            if (i > 0)
                std::shuffle(o.begin(), o.end(), rng);
            p.perm.push_back(o);
        }
        for (int j = 0; j < kTerms; j++)
            p.part.push_back((int)(rng() % (uint64_t)p.blocks));
        plans.push_back(p);
    }
    std::vector<uint64_t> first_block;
    std::vector<float> first;
    for (int threads : {1, 3}) {
        Device d(threads);
        ASSERT_NE(d.dev, nullptr);
        for (size_t i = 0; i < plans.size(); i++) {
            Block b = RunPlan(d.dev, terms, plans[i]);
            const std::vector<float> got = Finish(d.dev, b);
            if (first.empty()) {
                first = got;
                first_block = b.mem;
                for (int64_t v = 0; v < kValues; v++) {
                    const int kind = (int)(v % kW);
                    const float g = got[(size_t)v], w = want[(size_t)v];
                    if (kind == 0 || kind == 5) // truncated below 2^-64 of the largest term
                        EXPECT_TRUE(WithinUlp(g, w)) << "value " << v << ": " << g << " vs " << w;
                    else
                        EXPECT_EQ(g, w) << "value " << v << " (kind " << kind << ")";
                }
                EXPECT_EQ(want[4], INFINITY) << "kind 4 is meant to overflow";
                continue;
            }
            EXPECT_TRUE(SameFloats(got, first)) << threads << " threads, plan " << i;
            EXPECT_EQ(std::memcmp(b.mem.data(), first_block.data(), ctxpar_bins_bytes(kRows, kW)),
                      0)
                << "raw block, " << threads << " threads, plan " << i;
        }
    }
}

// Sums whose exact value lies just above a float's halfway point, by less than a double's
// precision: rounding to double first and then to float would give the wrong side.
TEST(Bins, RoundedOnce) {
    Device d(1);
    ASSERT_NE(d.dev, nullptr);
    const std::vector<std::vector<float>> cases = {
        {1.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -60)},
        {-1.0f, -std::ldexp(1.0f, -24), -std::ldexp(1.0f, -60)},
        {1.0f, std::ldexp(1.0f, -24), -std::ldexp(1.0f, -60)},
        {std::ldexp(1.0f, 30), std::ldexp(1.0f, 6), std::ldexp(1.0f, -25)},
        {std::ldexp(1.0f, -100), std::ldexp(3.0f, -125), std::ldexp(1.0f, -149)},
        {-1.0f}, // a negative top bin, the low ones 0
        {1.0f, -std::ldexp(1.0f, -64)},
        {-1.0f, std::ldexp(1.0f, -64), std::ldexp(1.0f, -40)},
        {-std::ldexp(1.0f, 40), std::ldexp(1.0f, 8), -std::ldexp(1.0f, -20)},
        {std::ldexp(1.0f, 127), std::ldexp(1.0f, 127), -std::ldexp(1.0f, 103),
         std::ldexp(1.0f, 70)},
    };
    for (size_t c = 0; c < cases.size(); c++) {
        Block b(d.dev, 1, 1);
        Exact e;
        for (float x : cases[c]) {
            const ctxpar_bins_shape sh = {1, 1, 1, 1, 0, 1};
            ASSERT_EQ(ctxpar_dev_bins_add(d.dev, b.Data(), &x, &sh, nullptr), CTXPAR_OK);
            e.Add(x);
        }
        EXPECT_EQ(Finish(d.dev, b)[0], e.ToFloat()) << "case " << c;
    }
}

// The SDK's functions themselves, on terms x 2^k of a wide range (k in [-200, 200], as the
// attention partials' e^L brings): order and merges give the same bits, and the value is the
// oracle's (rounded once to float) where nothing was truncated.
TEST(Bins, ReferenceTermsWithExponents) {
    const int n = 3000, values = 4;
    std::mt19937_64 rng(11);
    std::vector<std::pair<float, int64_t>> terms[values];
    for (int v = 0; v < values; v++)
        for (int i = 0; i < n; i++) {
            const float x = std::ldexp((float)((rng() >> 40) | (1u << 23)), -23) *
                            (rng() & 1 ? -1.0f : 1.0f); // [1, 2), 24 random bits
            // values 0, 1: k over [-200, 200]; 2, 3: k in [150, 159], all in the two bins of
            // the top (T = 4: weights from 2^96), so nothing is truncated
            const int64_t k = v < 2 ? (int64_t)(rng() % 401) - 200 : 150 + (int64_t)(rng() % 10);
            terms[v].push_back({x, k});
            if (v == 1 && i % 2 == 0) { // exact cancellation
                terms[v].push_back({-x, k});
                i++;
            }
        }
    std::vector<uint64_t> raw0;
    for (int order = 0; order < 4; order++) {
        const int parts = order + 1;
        std::vector<std::vector<uint64_t>> mem(
            (size_t)parts, std::vector<uint64_t>(ctxpar_bins_bytes(1, values) / 8 + 1, 0));
        std::vector<ctxpar_bins_view> views;
        for (auto &m : mem) {
            views.push_back(ctxpar_bins_at(m.data(), 1, values));
            for (int v = 0; v < values; v++)
                ctxpar_bins_clear_value(views.back(), v);
        }
        for (int v = 0; v < values; v++) {
            auto t = terms[v];
            if (order)
                std::shuffle(t.begin(), t.end(), rng);
            for (size_t i = 0; i < t.size(); i++)
                ctxpar_bins_add_term(views[rng() % (uint64_t)parts], v, t[i].first, t[i].second);
        }
        for (int p = parts - 1; p > 0; p--)
            for (int v = 0; v < values; v++)
                ctxpar_bins_merge_value(views[0], v, views[(size_t)p], v);
        if (order == 0)
            raw0 = mem[0];
        else
            EXPECT_EQ(mem[0], raw0) << "order " << order;
        for (int v = 0; v < values; v++) {
            const double got = std::ldexp(ctxpar_bins_value(views[0], v), -180); // exact
            Exact e;
            for (auto &t : terms[v])
                e.Add(t.first, (int)t.second - 180); // scaled by 2^-180: within float's range
            if (v >= 2)
                EXPECT_EQ((float)got, e.ToFloat()) << "value " << v;
            else // truncated below 2^-64 of the largest term; the largest are not all cancelled
                EXPECT_TRUE(WithinUlp((float)got, e.ToFloat())) << "value " << v;
        }
    }
}

// A block large enough for the parallel loops: 1 and 3 threads give the same bits.
TEST(Bins, ThreadsDoNotChangeBits) {
    const int64_t B = 2, S = 64, H = 4, W = 40, rows = B * S * H, n = rows * W;
    std::mt19937_64 rng(7);
    std::vector<std::vector<float>> src(12, std::vector<float>((size_t)n));
    std::vector<Exact> exact((size_t)n);
    for (auto &s : src)
        for (int64_t i = 0; i < n; i++) {
            s[(size_t)i] = RandomFloat(rng, -149, 100);
            exact[(size_t)i].Add(s[(size_t)i]);
        }
    std::vector<float> got[2];
    std::vector<uint64_t> raw[2];
    for (int t = 0; t < 2; t++) {
        Device d(t ? 3 : 1);
        ASSERT_NE(d.dev, nullptr);
        Block a(d.dev, rows, W), b(d.dev, rows, W);
        for (size_t k = 0; k < src.size(); k++) {
            const ctxpar_bins_shape sh = {B, S, H, W, 0, S};
            ASSERT_EQ(
                ctxpar_dev_bins_add(d.dev, (k % 2 ? a : b).Data(), src[k].data(), &sh, nullptr),
                CTXPAR_OK);
        }
        ASSERT_EQ(ctxpar_dev_bins_merge(d.dev, a.Data(), b.Data(), rows, W, nullptr), CTXPAR_OK);
        got[t] = Finish(d.dev, a);
        raw[t] = a.mem;
    }
    EXPECT_TRUE(SameFloats(got[0], got[1]));
    EXPECT_EQ(raw[0], raw[1]);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += !WithinUlp(got[0][(size_t)i], exact[(size_t)i].ToFloat());
    EXPECT_EQ(bad, 0);
}

// ---------------------------------------------------------------- (c): attention partials

struct Partial {
    std::vector<float> out, lse, lo; // [B, S, H, Dv], [B, H, S], [B, H, S]
};

TEST(Bins, AttentionPartials) {
    const int64_t B = 2, S = 5, H = 3, Dv = 7, W = Dv + 1, rows = B * S * H;
    const int C = 6; // partials per row
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<float> uo(-2.0f, 2.0f), ul(-50.0f, 50.0f);
    std::vector<Partial> parts((size_t)C);
    for (int c = 0; c < C; c++) {
        Partial &p = parts[(size_t)c];
        for (int64_t i = 0; i < rows * Dv; i++)
            p.out.push_back(uo(rng));
        for (int64_t i = 0; i < rows; i++) {
            const int64_t b = i / (H * S), h = (i / S) % H, s = i % S;
            float l = ul(rng);
            if (rng() % 5 == 0 || (b == 1 && h == 2 && s == 3)) // (1, 3, 2): no key at all
                l = -INFINITY;
            p.lse.push_back(l);
            p.lo.push_back(std::isfinite(l) ? l * 1e-7f * uo(rng) : 0.0f);
        }
    }
    // The direct computation, in long double.
    std::vector<long double> want_out((size_t)(rows * Dv)), want_lse((size_t)rows),
        scale((size_t)rows);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t r = (b * S + s) * H + h, li = (b * H + h) * S + s;
                long double den = 0, num[Dv] = {}, mag[Dv] = {};
                for (const Partial &p : parts) {
                    const long double L = (long double)p.lse[(size_t)li] + p.lo[(size_t)li];
                    const long double w = std::exp(L);
                    den += w;
                    for (int64_t d = 0; d < Dv; d++) {
                        num[d] += p.out[(size_t)(r * Dv + d)] * w;
                        mag[d] += std::fabs(p.out[(size_t)(r * Dv + d)]) * w;
                    }
                }
                want_lse[(size_t)li] = std::log(den);
                for (int64_t d = 0; d < Dv; d++) {
                    want_out[(size_t)(r * Dv + d)] = den > 0 ? num[d] / den : 0;
                    if (d == 0)
                        scale[(size_t)r] = den > 0 ? mag[d] / den : 0;
                    scale[(size_t)r] = std::max(scale[(size_t)r], den > 0 ? mag[d] / den : 0);
                }
            }
    // Orders: partials 0..C-1 as they come, reversed and one block each merged pairwise,
    // shuffled into 3 blocks with the lse_lo of a zero-lo partial passed as NULL.
    struct Result {
        std::vector<float> out, lse, lo;
        std::vector<uint64_t> raw;
    };
    std::vector<Result> results;
    for (int threads : {1, 3}) {
        Device d(threads);
        ASSERT_NE(d.dev, nullptr);
        for (int order = 0; order < 3; order++) {
            std::vector<int> seq(C);
            for (int c = 0; c < C; c++)
                seq[(size_t)c] = c;
            if (order == 1)
                std::reverse(seq.begin(), seq.end());
            if (order == 2)
                std::shuffle(seq.begin(), seq.end(), rng);
            const int nblocks = order == 0 ? 1 : order == 1 ? C : 3;
            std::vector<Block> blocks;
            for (int i = 0; i < nblocks; i++)
                blocks.emplace_back(d.dev, rows, W);
            for (int i = 0; i < C; i++) {
                const Partial &p = parts[(size_t)seq[(size_t)i]];
                const ctxpar_bins_shape sh = {B, S, H, W, 0, S};
                ASSERT_EQ(ctxpar_dev_bins_add_attn(d.dev, blocks[(size_t)(i % nblocks)].Data(),
                                                   p.out.data(), p.lse.data(), p.lo.data(), &sh,
                                                   nullptr),
                          CTXPAR_OK)
                    << ctxpar_last_error();
            }
            MergeTree(d.dev, blocks, order == 1 ? 2 : order == 2 ? 1 : 0);
            Result res;
            res.out.assign((size_t)(rows * Dv), -7.0f);
            res.lse.assign((size_t)rows, -7.0f);
            res.lo.assign((size_t)rows, -7.0f);
            const ctxpar_bins_shape sh = {B, S, H, W, 0, S};
            ASSERT_EQ(ctxpar_dev_bins_finish_attn(d.dev, blocks[0].Data(), &sh, res.out.data(),
                                                  res.lse.data(), res.lo.data(), nullptr),
                      CTXPAR_OK)
                << ctxpar_last_error();
            res.raw = blocks[0].mem;
            // Without lse_lo: lse as before.
            std::vector<float> lse2((size_t)rows), out2((size_t)(rows * Dv));
            ASSERT_EQ(ctxpar_dev_bins_finish_attn(d.dev, blocks[0].Data(), &sh, out2.data(),
                                                  lse2.data(), nullptr, nullptr),
                      CTXPAR_OK);
            EXPECT_TRUE(SameFloats(out2, res.out));
            EXPECT_TRUE(SameFloats(lse2, res.lse));
            results.push_back(res);
        }
    }
    const Result &r0 = results[0];
    for (int64_t i = 0; i < rows * Dv; i++) {
        const long double w = want_out[(size_t)i];
        const double tol =
            std::ldexp(std::fabs((double)w), -23) + 1e-13 * (double)scale[(size_t)(i / Dv)];
        EXPECT_LE(std::fabs((double)(r0.out[(size_t)i] - w)), tol) << "out " << i;
    }
    for (int64_t li = 0; li < rows; li++) {
        const long double w = want_lse[(size_t)li];
        if (std::isinf(w)) {
            EXPECT_EQ(r0.lse[(size_t)li], -INFINITY) << li;
            EXPECT_EQ(r0.lo[(size_t)li], 0.0f) << li;
            continue;
        }
        EXPECT_LE(std::fabs((double)((long double)r0.lse[(size_t)li] + r0.lo[(size_t)li] - w)),
                  1e-12)
            << "lse " << li;
    }
    // The row with no key: out 0, lse -inf.
    const int64_t r_empty = (1 * S + 3) * H + 2, li_empty = (1 * H + 2) * S + 3;
    EXPECT_EQ(r0.lse[(size_t)li_empty], -INFINITY);
    for (int64_t d = 0; d < Dv; d++)
        EXPECT_EQ(r0.out[(size_t)(r_empty * Dv + d)], 0.0f);
    for (size_t i = 1; i < results.size(); i++) {
        EXPECT_TRUE(SameFloats(results[i].out, r0.out)) << i;
        EXPECT_TRUE(SameFloats(results[i].lse, r0.lse)) << i;
        EXPECT_TRUE(SameFloats(results[i].lo, r0.lo)) << i;
        EXPECT_EQ(results[i].raw, r0.raw) << i;
    }
}

// Partials of rows [off, off + len) land in those rows only.
TEST(Bins, AttentionRowOffset) {
    Device d(1);
    ASSERT_NE(d.dev, nullptr);
    const int64_t B = 1, S = 4, H = 2, Dv = 2, W = 3;
    Block blk(d.dev, B * S * H, W);
    // Rows s = 1, 2 of the block from a source of len 2: out = (s + 1, -h), lse = s.
    std::vector<float> out, lse(4), lo(4, 0.0f);
    for (int64_t s = 0; s < 2; s++)
        for (int64_t h = 0; h < H; h++) {
            out.push_back((float)(s + 1));
            out.push_back((float)-h);
            lse[(size_t)(h * 2 + s)] = (float)s;
        }
    const ctxpar_bins_shape sh = {B, S, H, W, 1, 2};
    ASSERT_EQ(ctxpar_dev_bins_add_attn(d.dev, blk.Data(), out.data(), lse.data(), lo.data(), &sh,
                                       nullptr),
              CTXPAR_OK);
    std::vector<float> o((size_t)(B * S * H * Dv)), l((size_t)(B * S * H));
    const ctxpar_bins_shape all = {B, S, H, W, 0, S};
    ASSERT_EQ(
        ctxpar_dev_bins_finish_attn(d.dev, blk.Data(), &all, o.data(), l.data(), nullptr, nullptr),
        CTXPAR_OK);
    for (int64_t s = 0; s < S; s++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t r = s * H + h;
            const bool has = s == 1 || s == 2;
            EXPECT_EQ(o[(size_t)(r * Dv)], has ? (float)s : 0.0f) << s << " " << h;
            EXPECT_EQ(o[(size_t)(r * Dv + 1)], has ? (float)-h : 0.0f) << s << " " << h;
            if (has)
                EXPECT_NEAR(l[(size_t)(h * S + s)], (float)(s - 1), 1e-6) << s << " " << h;
            else
                EXPECT_EQ(l[(size_t)(h * S + s)], -INFINITY) << s << " " << h;
        }
}

// ---------------------------------------------------------------- (d): non-finite terms

TEST(Bins, NonFinite) {
    // Values: 0 finite + NaN; 1 +inf and -inf; 2 +inf alone among finites; 3 -inf alone;
    // 4 NaN among infinities.
    const int64_t W = 5, n = 50;
    std::mt19937_64 rng(3);
    std::vector<std::vector<float>> terms((size_t)W);
    for (int64_t v = 0; v < W; v++)
        for (int i = 0; i < n; i++)
            terms[(size_t)v].push_back(RandomFloat(rng, -20, 20));
    terms[0][7] = NAN;
    terms[1][3] = INFINITY;
    terms[1][40] = -INFINITY;
    terms[2][11] = INFINITY;
    terms[3][12] = -INFINITY;
    terms[4][1] = INFINITY;
    terms[4][2] = -NAN;
    terms[4][3] = INFINITY;
    std::vector<uint64_t> raw0;
    std::vector<float> first;
    for (int threads : {1, 3}) {
        Device d(threads);
        ASSERT_NE(d.dev, nullptr);
        for (int order = 0; order < 4; order++) {
            std::vector<Block> blocks;
            for (int i = 0; i < 3; i++)
                blocks.emplace_back(d.dev, 1, W);
            std::vector<std::vector<float>> t = terms;
            if (order)
                for (auto &x : t)
                    std::shuffle(x.begin(), x.end(), rng);
            for (int i = 0; i < n; i++) {
                std::vector<float> src((size_t)W);
                for (int64_t v = 0; v < W; v++)
                    src[(size_t)v] = t[(size_t)v][(size_t)i];
                const ctxpar_bins_shape sh = {1, 1, 1, W, 0, 1};
                ASSERT_EQ(ctxpar_dev_bins_add(d.dev, blocks[(size_t)(i % 3)].Data(), src.data(),
                                              &sh, nullptr),
                          CTXPAR_OK);
            }
            MergeTree(d.dev, blocks, order % 3);
            const std::vector<float> got = Finish(d.dev, blocks[0]);
            EXPECT_TRUE(std::isnan(got[0]));
            EXPECT_TRUE(std::isnan(got[1]));
            EXPECT_EQ(got[2], INFINITY);
            EXPECT_EQ(got[3], -INFINITY);
            EXPECT_TRUE(std::isnan(got[4]));
            if (first.empty()) {
                first = got;
                raw0 = blocks[0].mem;
            } else {
                EXPECT_TRUE(SameFloats(got, first)) << "NaN bits too";
                EXPECT_EQ(blocks[0].mem, raw0);
            }
        }
    }
    // An attention partial with lse +inf: out NaN, lse +inf, whatever else the row holds.
    Device d(1);
    ASSERT_NE(d.dev, nullptr);
    const int64_t Dv = 3, W2 = Dv + 1;
    Block blk(d.dev, 1, W2);
    const ctxpar_bins_shape sh = {1, 1, 1, W2, 0, 1};
    const float out_a[Dv] = {1.0f, -2.0f, 0.5f}, out_b[Dv] = {0.25f, 3.0f, -1.0f};
    const float lse_a = 3.0f, lse_b = INFINITY;
    ASSERT_EQ(ctxpar_dev_bins_add_attn(d.dev, blk.Data(), out_a, &lse_a, nullptr, &sh, nullptr),
              CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_bins_add_attn(d.dev, blk.Data(), out_b, &lse_b, nullptr, &sh, nullptr),
              CTXPAR_OK);
    float out[Dv], lse = 0.0f, lo = -1.0f;
    ASSERT_EQ(ctxpar_dev_bins_finish_attn(d.dev, blk.Data(), &sh, out, &lse, &lo, nullptr),
              CTXPAR_OK);
    for (float o : out)
        EXPECT_TRUE(std::isnan(o));
    EXPECT_EQ(lse, INFINITY);
    EXPECT_EQ(lo, 0.0f);
}

// ---------------------------------------------------------------- (e): the dispatch's checks

TEST(Bins, BadArgumentsAreRefused) {
    Device d(1);
    ctxpar_device *dev = d.dev;
    ASSERT_NE(dev, nullptr);
    EXPECT_TRUE(ctxpar_dev_has_bins(dev));
    Block blk(dev, 4, 3), other(dev, 4, 3);
    void *p = blk.Data();
    float buf[64] = {};
    const ctxpar_status bad = CTXPAR_ERR_INVALID_ARG;
    EXPECT_EQ(ctxpar_dev_bins_clear(dev, p, -1, 3, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_clear(dev, p, 4, 0, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_clear(dev, nullptr, 4, 3, nullptr), bad);
    const ctxpar_bins_shape ok = {1, 2, 2, 3, 0, 2};
    ctxpar_bins_shape past = ok, neg = ok, w0 = ok, offneg = ok;
    past.off = 1; // 1 + 2 > 2
    neg.batch = -1;
    w0.width = 0;
    offneg.off = -1;
    for (const ctxpar_bins_shape *sh :
         {&past, &neg, &w0, &offneg, static_cast<ctxpar_bins_shape *>(nullptr)}) {
        EXPECT_EQ(ctxpar_dev_bins_add(dev, p, buf, sh, nullptr), bad);
        EXPECT_EQ(ctxpar_dev_bins_add_attn(dev, p, buf, buf, nullptr, sh, nullptr), bad);
        EXPECT_EQ(ctxpar_dev_bins_finish_attn(dev, p, sh, buf, buf, nullptr, nullptr), bad);
    }
    EXPECT_EQ(ctxpar_dev_bins_add(dev, nullptr, buf, &ok, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_add(dev, p, nullptr, &ok, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_add_attn(dev, p, nullptr, buf, nullptr, &ok, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_add_attn(dev, p, buf, nullptr, nullptr, &ok, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_merge(dev, p, nullptr, 4, 3, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_merge(dev, nullptr, other.Data(), 4, 3, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_merge(dev, p, p, 4, 3, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_merge(dev, p, other.Data(), -2, 3, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_finish(dev, p, 4, 3, nullptr, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_finish(dev, p, 4, 0, buf, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_finish(dev, p, -1, 3, buf, nullptr), bad);
    ctxpar_bins_shape part = ok;
    part.off = 1;
    part.len = 1;
    EXPECT_EQ(ctxpar_dev_bins_finish_attn(dev, p, &part, buf, buf, nullptr, nullptr), bad)
        << "finish_attn takes whole blocks";
    EXPECT_EQ(ctxpar_dev_bins_finish_attn(dev, p, &ok, nullptr, buf, nullptr, nullptr), bad);
    EXPECT_EQ(ctxpar_dev_bins_finish_attn(dev, p, &ok, buf, nullptr, nullptr, nullptr), bad);
    // Empty calls are fine.
    EXPECT_EQ(ctxpar_dev_bins_clear(dev, nullptr, 0, 3, nullptr), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_bins_finish(dev, nullptr, 0, 3, nullptr, nullptr), CTXPAR_OK);
}

void NoDestroy(ctxpar_device *) {}

TEST(Bins, DeviceWithoutThemIsNotSupported) {
    Device cpu(1);
    ASSERT_NE(cpu.dev, nullptr);
    struct ctxpar_device_ops ops = *cpu.dev->ops; // the CPU device's table, minus the bins ops
    ops.name = "cpu without bins";
    ops.destroy = NoDestroy; // the impl stays the CPU device's
    ops.bins_clear = nullptr;
    ops.bins_add = nullptr;
    ops.bins_add_attn = nullptr;
    ops.bins_merge = nullptr;
    ops.bins_finish = nullptr;
    ops.bins_finish_attn = nullptr;
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(ctxpar_device_create(&ops, cpu.dev->impl, 1, &dev), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_FALSE(ctxpar_dev_has_bins(dev));
    Block blk(cpu.dev, 2, 2), other(cpu.dev, 2, 2);
    float buf[8] = {};
    const ctxpar_bins_shape sh = {1, 2, 1, 2, 0, 2};
    const ctxpar_status ns = CTXPAR_ERR_NOT_SUPPORTED;
    EXPECT_EQ(ctxpar_dev_bins_clear(dev, blk.Data(), 2, 2, nullptr), ns);
    EXPECT_EQ(ctxpar_dev_bins_add(dev, blk.Data(), buf, &sh, nullptr), ns);
    EXPECT_EQ(ctxpar_dev_bins_add_attn(dev, blk.Data(), buf, buf, nullptr, &sh, nullptr), ns);
    EXPECT_EQ(ctxpar_dev_bins_merge(dev, blk.Data(), other.Data(), 2, 2, nullptr), ns);
    EXPECT_EQ(ctxpar_dev_bins_finish(dev, blk.Data(), 2, 2, buf, nullptr), ns);
    EXPECT_EQ(ctxpar_dev_bins_finish_attn(dev, blk.Data(), &sh, buf, buf, nullptr, nullptr), ns);
    // A table with some of the six is refused.
    ops.bins_clear = cpu.dev->ops->bins_clear;
    ctxpar_device *half = nullptr;
    EXPECT_EQ(ctxpar_device_create(&ops, cpu.dev->impl, 1, &half), CTXPAR_ERR_INVALID_ARG);
    ctxpar_device_destroy(dev);
}

} // namespace
