// The device conformance suite's harness: a device under test (made by a factory), its memory
// as a test sees it, block problems in a global sequence and the fp64 oracle's answers. The
// suite (device_conformance.cc) runs every case for every factory (device_conformance_test.cc);
// backend-specific suites (cpu_ops_test, cuda_ops_test) build on the same harness.
#ifndef CPT_TESTING_DEVICE_CONFORMANCE_H
#define CPT_TESTING_DEVICE_CONFORMANCE_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "dispatch.h"
#include "reference/data.h"
#include "reference/metrics.h"
#include "reference/oracle.h"

namespace cpt_devconf {

// How to make one kind of device. A new backend gets the whole suite by adding one of these to
// DeviceFactories() (device_conformance_test.cc).
struct DeviceFactory {
    std::string name; // a test-name suffix: letters, digits, '_'
    // Makes a device; returns "" or why this kind cannot run here (the cases then skip, saying
    // so: "skipped: no CUDA device (...)").
    std::string (*create)(ctxpar_device **dev_out);
    // Bound on max |out - oracle| / max |oracle| of the block forward for this dtype and head_dim
    // (the rest of the suite's bounds are F32 sums, the same for every backend).
    double (*out_tol)(ctxpar_dtype dtype, int64_t head_dim);
    int64_t max_head_dim; // above it the forward must say NOT_SUPPORTED
    // Whether the suite also compares with the CPU reference device (ggml-style), in addition
    // to the oracle.
    bool compare_with_cpu;
    // The forward and backward sweeps (mask x position x dtype x GQA) run every n-th case on
    // this device (1: all): a table whose code another factory already sweeps in full (the same
    // forward, say) takes a spread subset, which keeps the suite fast under sanitizers.
    int fwd_every, bwd_every;
    // Why a query row's forward bits may depend on the other rows of a call, or nullptr: they
    // do not (the contract all-gather's bitwise promise rests on; its case skips, saying why).
    const char *rows_differ;
};

std::vector<DeviceFactory> DeviceFactories();

// Named in test output; without this GoogleTest prints the struct's bytes, padding included.
inline void PrintTo(const DeviceFactory &f, std::ostream *os) {
    *os << f.name;
}

// Bounds shared by every backend (cpu_ops_test and cuda_ops_test explain the measurements):
//  - forward lse and F32 forward out: F32 rounding of scores, exponentials and running sums;
//  - backward dq, dk, dv: F32 sums of dS = P (dP - delta), relative to max |grad|;
//  - delta and merges: a handful of F32 roundings per element.
constexpr double kTolF32 = 1e-5;
constexpr double kTolSmall = 1e-6;

// A device made by a factory; `skip` says why not when it could not be made.
struct TestDevice {
    ctxpar_device *dev = nullptr;
    std::string skip;
    explicit TestDevice(const DeviceFactory &f) { skip = f.create(&dev); }
    ~TestDevice() { ctxpar_device_destroy(dev); }
    TestDevice(const TestDevice &) = delete;
    TestDevice &operator=(const TestDevice &) = delete;
};

// Memory of one device as a test sees it: host copies go in, results come back, every buffer
// through the device's own ops (so they are tested too). On the CPU it is host memory.
class Space {
  public:
    explicit Space(ctxpar_device *dev) : dev_(dev) {}
    ~Space() {
        for (auto &b : bufs_)
            EXPECT_EQ(ctxpar_dev_free(dev_, b.first, b.second, CTXPAR_MEM_DEVICE), CTXPAR_OK)
                << ctxpar_last_error();
    }
    Space(const Space &) = delete;
    Space &operator=(const Space &) = delete;

    void *Put(const void *host, size_t bytes) {
        void *p = nullptr;
        EXPECT_EQ(ctxpar_dev_alloc(dev_, bytes, CTXPAR_MEM_DEVICE, &p), CTXPAR_OK)
            << ctxpar_last_error();
        bufs_.push_back({p, bytes});
        if (host && bytes && p) {
            EXPECT_EQ(ctxpar_dev_copy(dev_, p, host, bytes, In(), nullptr), CTXPAR_OK)
                << ctxpar_last_error();
        }
        return p;
    }
    template <class T> T *Put(const std::vector<T> &v) {
        return (T *)Put(v.data(), v.size() * sizeof(T));
    }
    void Get(void *host, const void *p, size_t bytes) {
        ASSERT_EQ(ctxpar_dev_copy(dev_, host, p, bytes, Out(), nullptr), CTXPAR_OK)
            << ctxpar_last_error();
        ASSERT_EQ(ctxpar_dev_stream_sync(dev_, nullptr), CTXPAR_OK) << ctxpar_last_error();
    }
    template <class T> std::vector<T> Get(const T *p, size_t n) {
        std::vector<T> v(n);
        if (n)
            Get(v.data(), p, n * sizeof(T));
        return v;
    }
    ctxpar_device *dev() const { return dev_; }

  private:
    ctxpar_copy_kind In() const { return dev_->host_memory ? CTXPAR_COPY_H2H : CTXPAR_COPY_H2D; }
    ctxpar_copy_kind Out() const { return dev_->host_memory ? CTXPAR_COPY_H2H : CTXPAR_COPY_D2H; }
    ctxpar_device *dev_;
    std::vector<std::pair<void *, size_t>> bufs_;
};

inline size_t DtypeSize(ctxpar_dtype dt) {
    return dt == CTXPAR_DTYPE_F32 ? 4 : 2;
}

// A host tensor owning its memory; pad adds elements to the row (seq) stride.
struct HostTensor {
    std::vector<unsigned char> mem;
    ctxpar_tensor t;
    HostTensor(ctxpar_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, int64_t pad = 0) {
        int64_t row = h * d + pad;
        mem.assign((size_t)(b * s * row + 1) * DtypeSize(dt), 0);
        t.data = mem.data();
        t.dtype = dt;
        t.shape[0] = b, t.shape[1] = s, t.shape[2] = h, t.shape[3] = d;
        t.stride[0] = s * row, t.stride[1] = row, t.stride[2] = d, t.stride[3] = 1;
    }
    int64_t numel() const { return t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3]; }
    std::vector<double> f64() const {
        std::vector<double> x((size_t)numel());
        cpt_test_to_f64(&t, x.data());
        return x;
    }
    // The same tensor in `space` (same strides).
    ctxpar_tensor On(Space *space) const {
        ctxpar_tensor d = t;
        d.data = space->Put(mem.data(), mem.size());
        return d;
    }
};

// How many positions the spans hold (Sq()/Sk() are called in per-element loops: no vector).
inline int64_t Count(const std::vector<ctxpar_span> &spans) {
    int64_t n = 0;
    for (const ctxpar_span &s : spans)
        n += s.len;
    return n;
}

inline std::vector<int64_t> Positions(const std::vector<ctxpar_span> &spans) {
    std::vector<int64_t> pos;
    for (const ctxpar_span &s : spans)
        for (int64_t i = 0; i < s.len; i++)
            pos.push_back(s.start + i * s.stride);
    return pos;
}

// Where the query and key rows of a block sit in a global sequence of 512.
struct PosCase {
    const char *name;
    std::vector<ctxpar_span> q, k;
};

inline std::vector<PosCase> PosCases() {
    return {
        {"same", {{0, 150, 1}}, {{0, 150, 1}}},
        {"q_after_k", {{300, 100, 1}}, {{100, 130, 1}}},
        {"q_before_k", {{0, 90, 1}}, {{200, 120, 1}}},
        {"overlap", {{50, 140, 1}}, {{100, 150, 1}}},
        // striped over 4 ranks: rank 3's queries against rank 1's keys
        {"striped", {{3, 100, 4}}, {{1, 110, 4}}},
        // zigzag over 2 ranks of 4 chunks of 64: rank 0's queries against rank 1's keys
        {"zigzag", {{0, 64, 1}, {192, 64, 1}}, {{64, 64, 1}, {128, 64, 1}}},
    };
}

// Document boundaries not aligned with tiles, of very different lengths.
inline const std::vector<int32_t> &Docs() {
    static const std::vector<int32_t> docs = {0, 37, 100, 230, 300, 512};
    return docs;
}

struct MaskCase {
    const char *name;
    int causal;
    int64_t window;
    bool docs;
};

inline std::vector<MaskCase> MaskCases() {
    return {
        {"none", 0, 0, false},    {"causal", 1, 0, false}, {"causal_window", 1, 48, false},
        {"window", 0, 48, false}, {"docs", 0, 0, true},    {"docs_causal", 1, 0, true},
    };
}

// One block pair: shapes, positions, mask, and the tensors filled from the global data.
struct Problem {
    int64_t B = 2, Hq = 4, Hkv = 2, D = 64, seq_global = 512, pad = 0;
    ctxpar_dtype dtype = CTXPAR_DTYPE_F32;
    std::vector<ctxpar_span> qs, ks;
    int causal = 0;
    int64_t window = 0;
    int64_t window_right = 0; // two-sided window (mask none): k - q <= window_right; 0 = none
    std::vector<int32_t> cu;  // empty: one document
    float scale = 0.0f;      // 0: 1/sqrt(D)
    int64_t Dv = 0;          // head_dim of v, out, dout, dv (MLA); 0: D
    float softcap = 0.0f;    // > 0: soft-capped scores
    uint64_t seed = 7;
    std::unique_ptr<HostTensor> q, k, v, dout;
    std::vector<int64_t> qpos, kpos;

    int64_t Sq() const { return Count(qs); }
    int64_t Sk() const { return Count(ks); }
    float Scale() const { return scale != 0.0f ? scale : 1.0f / std::sqrt((float)D); }
    int64_t DV() const { return Dv > 0 ? Dv : D; }
    size_t OutSize() const { return (size_t)(B * Sq() * Hq * DV()); } // out, dout
    size_t QSize() const { return (size_t)(B * Sq() * Hq * D); }      // q, dq
    size_t LseSize() const { return (size_t)(B * Hq * Sq()); }
    size_t KvSize() const { return (size_t)(B * Sk() * Hkv * D); }    // k, dk
    size_t VSize() const { return (size_t)(B * Sk() * Hkv * DV()); }  // v, dv
    // What the oracle computes beyond the mask (none unless Dv or softcap is set).
    cpt_oracle_features Features() const { return {DV(), (double)softcap, nullptr, nullptr, 0}; }

    void Make() {
        qpos = Positions(qs);
        kpos = Positions(ks);
        q.reset(new HostTensor(dtype, B, Sq(), Hq, D, pad));
        k.reset(new HostTensor(dtype, B, Sk(), Hkv, D, pad));
        v.reset(new HostTensor(dtype, B, Sk(), Hkv, DV(), pad));
        dout.reset(new HostTensor(dtype, B, Sq(), Hq, DV(), pad));
        cpt_test_fill(&q->t, seed, 1, seq_global, qpos.data());
        cpt_test_fill(&k->t, seed, 2, seq_global, kpos.data());
        cpt_test_fill(&v->t, seed, 3, seq_global, kpos.data());
        cpt_test_fill(&dout->t, seed, 4, seq_global, qpos.data());
    }

    ctxpar_mask_desc Mask() const {
        ctxpar_mask_desc m = {causal, window, nullptr, 0, window_right, 0};
        if (!cu.empty()) {
            m.cu_seqlens = cu.data();
            m.num_docs = (int64_t)cu.size() - 1;
        }
        return m;
    }

    // The block with q, k, v in host memory (a host-memory device reads them in place).
    ctxpar_attn_block Block() const {
        ctxpar_attn_block blk = {}; // zeroed: features and fields a test does not set are off
        blk.q = q->t;
        blk.k = k->t;
        blk.v = v->t;
        blk.q_pos = {qs.data(), (int)qs.size()};
        blk.k_pos = {ks.data(), (int)ks.size()};
        blk.mask = Mask();
        blk.scale = Scale();
        blk.softcap = softcap;
        return blk;
    }

    // The block with q, k, v copied into `space`.
    ctxpar_attn_block Block(Space *space) const {
        ctxpar_attn_block blk = Block();
        blk.q = q->On(space);
        blk.k = k->On(space);
        blk.v = v->On(space);
        return blk;
    }

    cpt_oracle_shape Shape() const { return {B, Sq(), Sk(), Hq, Hkv, D}; }

    void OracleFwd(std::vector<double> *out, std::vector<double> *lse) const {
        out->assign(OutSize(), 0.0);
        lse->assign(LseSize(), 0.0);
        cpt_oracle_shape sh = Shape();
        ctxpar_mask_desc m = Mask();
        std::vector<double> qd = q->f64(), kd = k->f64(), vd = v->f64();
        const cpt_oracle_features f = Features();
        cpt_oracle_fwd_ex(&sh, qd.data(), kd.data(), vd.data(), qpos.data(), kpos.data(), &m, &f,
                          (double)Scale(), out->data(), lse->data());
    }

    void OracleBwd(std::vector<double> *dq, std::vector<double> *dk,
                   std::vector<double> *dv) const {
        dq->assign(QSize(), 0.0);
        dk->assign(KvSize(), 0.0);
        dv->assign(VSize(), 0.0);
        cpt_oracle_shape sh = Shape();
        ctxpar_mask_desc m = Mask();
        std::vector<double> qd = q->f64(), kd = k->f64(), vd = v->f64(), dod = dout->f64();
        const cpt_oracle_features f = Features();
        cpt_oracle_bwd_ex(&sh, qd.data(), kd.data(), vd.data(), qpos.data(), kpos.data(), &m, &f,
                          (double)Scale(), dod.data(), dq->data(), dk->data(), dv->data(),
                          nullptr);
    }
};

inline void SetMask(Problem *p, const MaskCase &m) {
    p->causal = m.causal;
    p->window = m.window;
    if (m.docs)
        p->cu = Docs();
}

struct FwdResult {
    std::vector<float> out, lse;
};

// The block forward on `dev` into accumulators starting as `init` (merge = 1) or NaN (merge = 0).
inline FwdResult RunFwd(ctxpar_device *dev, const Problem &p, int merge = 0,
                        const FwdResult *init = nullptr) {
    FwdResult r;
    Space sp(dev);
    ctxpar_attn_block blk = p.Block(&sp);
    std::vector<float> o0 = init ? init->out : std::vector<float>(p.OutSize(), NAN);
    std::vector<float> l0 = init ? init->lse : std::vector<float>(p.LseSize(), NAN);
    float *out = sp.Put(o0), *lse = sp.Put(l0);
    EXPECT_EQ(ctxpar_dev_attn_block_fwd(dev, &blk, out, lse, merge, nullptr), CTXPAR_OK)
        << ctxpar_last_error();
    r.out = sp.Get(out, p.OutSize());
    r.lse = sp.Get(lse, p.LseSize());
    return r;
}

struct BwdResult {
    std::vector<float> delta, dq, dk, dv;
};

// bwd_prep and the block backward on `dev`, from the oracle's out and lse (rounded to F32) so
// that only the backward's own error is measured; accumulators start at acc0 (or 0).
inline BwdResult RunBwd(ctxpar_device *dev, const Problem &p, const std::vector<double> &ref_out,
                        const std::vector<double> &ref_lse, float acc0 = 0.0f,
                        bool want_dq = true, bool want_dk = true, bool want_dv = true) {
    BwdResult r;
    Space sp(dev);
    std::vector<float> out_h(ref_out.begin(), ref_out.end()), lse_h(ref_lse.begin(), ref_lse.end());
    ctxpar_tensor out =
        ctxpar_tensor_bshd(sp.Put(out_h), CTXPAR_DTYPE_F32, p.B, p.Sq(), p.Hq, p.DV());
    ctxpar_tensor dout = p.dout->On(&sp);
    float *lse = sp.Put(lse_h);
    float *delta = sp.Put(std::vector<float>(p.LseSize(), NAN));
    float *dq = sp.Put(std::vector<float>(p.QSize(), acc0));
    float *dk = sp.Put(std::vector<float>(p.KvSize(), acc0));
    float *dv = sp.Put(std::vector<float>(p.VSize(), acc0));
    EXPECT_EQ(ctxpar_dev_attn_bwd_prep(dev, &out, &dout, delta, nullptr), CTXPAR_OK)
        << ctxpar_last_error();
    ctxpar_attn_block blk = p.Block(&sp);
    EXPECT_EQ(ctxpar_dev_attn_block_bwd(dev, &blk, &dout, lse, delta, want_dq ? dq : nullptr,
                                        want_dk ? dk : nullptr, want_dv ? dv : nullptr, nullptr),
              CTXPAR_OK)
        << ctxpar_last_error();
    r.delta = sp.Get(delta, p.LseSize());
    r.dq = sp.Get(dq, p.QSize());
    r.dk = sp.Get(dk, p.KvSize());
    r.dv = sp.Get(dv, p.VSize());
    return r;
}

inline std::vector<double> F64(const std::vector<float> &x) {
    return std::vector<double>(x.begin(), x.end());
}

// Relative error of got against ref, with no non-finite mismatch.
inline void ExpectClose(const std::vector<float> &got, const std::vector<double> &ref, double tol,
                        const std::string &what) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    cpt_error_stats e = cpt_compare_f32(got.data(), ref.data(), got.size());
    EXPECT_EQ(e.nonfinite, 0) << what << ": worst element " << e.worst;
    EXPECT_LE(e.rel, tol) << what << ": worst element " << e.worst << " got "
                          << (e.worst >= 0 ? got[(size_t)e.worst] : 0.0) << " want "
                          << (e.worst >= 0 ? ref[(size_t)e.worst] : 0.0);
}

inline size_t BitDiff(const std::vector<float> &a, const std::vector<float> &b) {
    if (a.size() != b.size())
        return SIZE_MAX;
    return cpt_bitwise_diff(a.data(), b.data(), a.size(), sizeof(float), nullptr);
}

// Rows the oracle finds fully masked have out exactly 0 and lse -inf; no NaN anywhere.
inline void ExpectEmptyRows(const Problem &p, const FwdResult &r,
                            const std::vector<double> &ref_lse) {
    ASSERT_EQ(r.lse.size(), p.LseSize());
    for (int64_t b = 0; b < p.B; b++)
        for (int64_t h = 0; h < p.Hq; h++)
            for (int64_t s = 0; s < p.Sq(); s++) {
                size_t li = (size_t)((b * p.Hq + h) * p.Sq() + s);
                ASSERT_FALSE(std::isnan(r.lse[li]));
                if (ref_lse[li] != -INFINITY)
                    continue;
                ASSERT_EQ(r.lse[li], -INFINITY) << "row b" << b << " h" << h << " s" << s;
                for (int64_t d = 0; d < p.DV(); d++)
                    ASSERT_EQ(r.out[(size_t)(((b * p.Sq() + s) * p.Hq + h) * p.DV() + d)], 0.0f);
            }
    for (float x : r.out)
        ASSERT_FALSE(std::isnan(x));
}

} // namespace cpt_devconf

#endif // CPT_TESTING_DEVICE_CONFORMANCE_H
