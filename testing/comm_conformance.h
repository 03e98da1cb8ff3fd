// The comm conformance suite's harness: a "world" (a factory) runs one body on every rank of a
// comm of its kind (threads of this process for the local comm, this process's rank under mpirun
// for MPI); expected bytes are computed here from (seed, rank, index). The suite
// (comm_conformance.cc) runs every case for every world its binary lists (CommWorlds()):
// comm_conformance_test.cc (local, the fault-injecting decorator in pass-through),
// comm_conformance_mpi_test.cc (MPI) and gpu/comm_conformance_nccl_test.cc (NCCL, device memory).
#ifndef CPT_TESTING_COMM_CONFORMANCE_H
#define CPT_TESTING_COMM_CONFORMANCE_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dispatch.h"

#define EXPECT_OK(expr)                                                                            \
    do {                                                                                           \
        ctxpar_status st_ = (expr);                                                                \
        EXPECT_EQ(st_, CTXPAR_OK) << #expr << ": " << ctxpar_last_error();                         \
    } while (0)

namespace cpt_commconf {

// One rank's part of a case: its rank, the comm's size, its comm, and the device whose memory
// the comm's transfers read and write (NULL: host memory, as for the local and MPI comms; the
// rank's GPU for NCCL). Cases stage their bytes through CommBuffer so one case serves both.
using CommBody =
    std::function<void(int rank, int size, ctxpar_comm *comm, ctxpar_device *memory)>;

// How to get comms of one kind. A new comm gets the whole suite by adding one of these to its
// binary's CommWorlds().
struct CommWorld {
    std::string name; // a test-name suffix: letters, digits, '_'
    // Runs body on every rank of a fresh comm (timeout 30 s) and destroys it; returns "" or why
    // this kind cannot run here (the case then skips, saying so).
    std::function<std::string(const CommBody &body)> run;
};

std::vector<CommWorld> CommWorlds();

inline uint64_t Mix(uint64_t x) { // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

inline uint8_t ByteAt(uint64_t seed, int rank, size_t i) {
    return (uint8_t)Mix(Mix(seed * 1000003u + (uint64_t)rank) + i);
}

inline std::vector<uint8_t> Pattern(uint64_t seed, int rank, size_t n) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = ByteAt(seed, rank, i);
    return v;
}

// A float with a random 24-bit mantissa, sign and an exponent in [-12, 12]: sums of these round
// differently in different orders.
inline float FloatAt(uint64_t seed, int rank, size_t i) {
    uint64_t h = Mix(Mix(seed * 7919u + (uint64_t)rank) + i);
    float m = (float)(h & 0xffffff) / 16777216.0f;
    int e = (int)((h >> 24) % 25) - 12;
    return ((h >> 60) & 1 ? -1.0f : 1.0f) * std::ldexp(0.5f + 0.5f * m, e);
}

// A buffer for a comm op, in the memory a world's transfers use, filled from `init`.
template <class T> class CommBuffer {
  public:
    CommBuffer(ctxpar_device *memory, const std::vector<T> &init) : dev_(memory), host_(init) {
        if (!dev_ || host_.empty())
            return;
        void *p = nullptr;
        EXPECT_OK(ctxpar_dev_alloc(dev_, Bytes(), CTXPAR_MEM_DEVICE, &p));
        ptr_ = static_cast<T *>(p);
        if (ptr_)
            EXPECT_OK(ctxpar_dev_copy(dev_, ptr_, host_.data(), Bytes(), CTXPAR_COPY_H2D, nullptr));
    }
    ~CommBuffer() {
        if (ptr_)
            EXPECT_OK(ctxpar_dev_free(dev_, ptr_, Bytes(), CTXPAR_MEM_DEVICE));
    }
    CommBuffer(const CommBuffer &) = delete;
    CommBuffer &operator=(const CommBuffer &) = delete;

    T *data() { return dev_ ? ptr_ : host_.data(); }
    // The contents now (after the op's wait).
    const std::vector<T> &Read() {
        if (ptr_) {
            EXPECT_OK(ctxpar_dev_copy(dev_, host_.data(), ptr_, Bytes(), CTXPAR_COPY_D2H, nullptr));
            EXPECT_OK(ctxpar_dev_stream_sync(dev_, nullptr));
        }
        return host_;
    }

  private:
    size_t Bytes() const { return host_.size() * sizeof(T); }
    ctxpar_device *dev_;
    std::vector<T> host_;
    T *ptr_ = nullptr;
};

// The index of the first byte where got differs from want, or -1.
inline long FirstDiff(const uint8_t *got, const uint8_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            return (long)i;
    return -1;
}

} // namespace cpt_commconf

#endif // CPT_TESTING_COMM_CONFORMANCE_H
