// The comm conformance suite's harness: a "world" (a factory) runs one body on every rank of a
// comm of its kind (threads of this process for the local comm, this process's rank under mpirun
// for MPI); expected bytes are computed here from (seed, rank, index). The suite
// (comm_conformance.cc) runs every case for every world its binary lists (CommWorlds()):
// comm_conformance_test.cc (local, the fault-injecting decorator in pass-through) and
// comm_conformance_mpi_test.cc (MPI).
#ifndef CPT_TESTING_COMM_CONFORMANCE_H
#define CPT_TESTING_COMM_CONFORMANCE_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ctxpar_backend.h"

#define EXPECT_OK(expr)                                                                            \
    do {                                                                                           \
        ctxpar_status st_ = (expr);                                                                \
        EXPECT_EQ(st_, CTXPAR_OK) << #expr << ": " << ctxpar_last_error();                         \
    } while (0)

namespace cpt_commconf {

// One rank's part of a case: its rank, the comm's size, its comm.
using CommBody = std::function<void(int rank, int size, ctxpar_comm *comm)>;

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

// The index of the first byte where got differs from want, or -1.
inline long FirstDiff(const uint8_t *got, const uint8_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            return (long)i;
    return -1;
}

} // namespace cpt_commconf

#endif // CPT_TESTING_COMM_CONFORMANCE_H
