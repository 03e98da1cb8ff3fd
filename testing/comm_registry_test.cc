// The registry of comms by name (ctxpar_comm_names, ctxpar_comm_world_*, ctxpar_comm_register):
// the local comm is there and first, its world runs every rank in this process and the comms it
// makes talk to each other, a registered kind is found and its functions called, and bad
// registrations, unknown names and out-of-range ranks are refused with a message.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "ctxpar_backend.h"

namespace {

std::vector<std::string> Names() {
    const int n = ctxpar_comm_names(nullptr, nullptr, 0);
    std::vector<const char *> names(n), about(n);
    EXPECT_EQ(ctxpar_comm_names(names.data(), about.data(), n), n);
    std::vector<std::string> out;
    for (int i = 0; i < n; i++) {
        EXPECT_NE(about[i], nullptr);
        out.emplace_back(names[i]);
    }
    return out;
}

TEST(CommRegistry, LocalIsFirstAndItsRanksTalk) {
    const std::vector<std::string> names = Names();
    ASSERT_FALSE(names.empty());
    EXPECT_EQ(names[0], "local");
    const int P = 3;
    ctxpar_comm_world *world = nullptr;
    ASSERT_EQ(ctxpar_comm_world_create("local", P, &world), CTXPAR_OK) << ctxpar_last_error();
    int first = -1;
    EXPECT_EQ(ctxpar_comm_world_ranks(world, &first), P) << "every rank in this process";
    EXPECT_EQ(first, 0);
    // Each rank adds (rank + 1) * 10: the sum is 10 + 20 + 30 on every rank.
    std::vector<int64_t> sums(P, -1);
    std::vector<int> ranks(P, -1), sizes(P, -1);
    std::vector<ctxpar_status> status(P, CTXPAR_ERR_INTERNAL);
    std::vector<std::thread> threads;
    for (int i = 0; i < P; i++)
        threads.emplace_back([&, i] {
            ctxpar_comm *comm = nullptr;
            status[i] = ctxpar_comm_world_comm(world, i, nullptr, &comm);
            if (status[i] != CTXPAR_OK)
                return;
            ranks[i] = ctxpar_comm_rank(comm);
            sizes[i] = ctxpar_comm_size(comm);
            int64_t v = (ranks[i] + 1) * 10;
            status[i] = ctxpar_comm_allreduce_i64(comm, &v, 1, CTXPAR_REDUCE_SUM);
            sums[i] = v;
            ctxpar_comm_destroy(comm);
        });
    for (std::thread &t : threads)
        t.join();
    for (int i = 0; i < P; i++) {
        EXPECT_EQ(status[i], CTXPAR_OK) << "rank " << i;
        EXPECT_EQ(ranks[i], i);
        EXPECT_EQ(sizes[i], P);
        EXPECT_EQ(sums[i], 60);
    }
    ctxpar_comm_world_destroy(world);
}

TEST(CommRegistry, BadArgumentsAreRefusedAndNothingIsWritten) {
    ctxpar_comm_world *world = reinterpret_cast<ctxpar_comm_world *>(0x1);
    EXPECT_EQ(ctxpar_comm_world_create("carrier-pigeon", 2, &world), CTXPAR_ERR_NOT_SUPPORTED);
    const std::string msg = ctxpar_last_error();
    EXPECT_NE(msg.find("'carrier-pigeon'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("local"), std::string::npos) << "names the comms there are: " << msg;
    EXPECT_EQ(ctxpar_comm_world_create("local", 0, &world), CTXPAR_ERR_INVALID_ARG)
        << "the local comm cannot choose its own size";
    EXPECT_EQ(ctxpar_comm_world_create("local", -1, &world), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_world_create(nullptr, 2, &world), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(world, reinterpret_cast<ctxpar_comm_world *>(0x1)) << "written on error";
    EXPECT_EQ(ctxpar_comm_world_create("local", 2, nullptr), CTXPAR_ERR_INVALID_ARG);

    ASSERT_EQ(ctxpar_comm_world_create("local", 2, &world), CTXPAR_OK);
    ctxpar_comm *comm = reinterpret_cast<ctxpar_comm *>(0x1);
    EXPECT_EQ(ctxpar_comm_world_comm(world, 2, nullptr, &comm), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("(0..1)"), std::string::npos)
        << ctxpar_last_error();
    EXPECT_EQ(ctxpar_comm_world_comm(world, -1, nullptr, &comm), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_world_comm(nullptr, 0, nullptr, &comm), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(comm, reinterpret_cast<ctxpar_comm *>(0x1)) << "written on error";
    ctxpar_comm_world_destroy(world);
    ctxpar_comm_world_destroy(nullptr); // a no-op
    EXPECT_EQ(ctxpar_comm_world_ranks(nullptr, nullptr), 0);
}

// A kind that runs ranks 5 and 6 of a job here, and counts what the registry calls.
int created = 0, made = 0, destroyed = 0, last_i = -1;

ctxpar_status FakeCreate(int nranks, void **impl_out, int *first_out, int *count_out) {
    created++;
    if (nranks != 8)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "fake: 8 ranks only");
    *impl_out = &made;
    *first_out = 5;
    *count_out = 2;
    return CTXPAR_OK;
}
ctxpar_status FakeComm(void *impl, int i, ctxpar_device *, ctxpar_comm **) {
    EXPECT_EQ(impl, &made);
    made++;
    last_i = i;
    return CTXPAR_ERROR(CTXPAR_ERR_COMM, "fake: no network");
}
void FakeDestroy(void *impl) {
    EXPECT_EQ(impl, &made);
    destroyed++;
}
const ctxpar_comm_world_ops fake_ops = {FakeCreate, FakeComm, FakeDestroy};
const ctxpar_comm_world_ops incomplete_ops = {FakeCreate, nullptr, FakeDestroy};

TEST(CommRegistry, ARegisteredKindIsFoundAndBadOnesAreRefused) {
    const size_t before = Names().size();
    ASSERT_EQ(ctxpar_comm_register("fake", "a test's comm", &fake_ops), CTXPAR_OK);
    EXPECT_EQ(Names().size(), before + 1);
    EXPECT_EQ(Names().back(), "fake");
    EXPECT_EQ(ctxpar_comm_register("fake", "again", &fake_ops), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_register("local", "a second local", &fake_ops), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_register("", "no name", &fake_ops), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_register("half", "no comm()", &incomplete_ops), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_register("none", "no ops", nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(Names().size(), before + 1) << "refused ones are not listed";

    ctxpar_comm_world *world = nullptr;
    EXPECT_EQ(ctxpar_comm_world_create("fake", 4, &world), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(world, nullptr);
    EXPECT_EQ(destroyed, 0) << "a failed create leaves nothing to destroy";
    ASSERT_EQ(ctxpar_comm_world_create("fake", 8, &world), CTXPAR_OK) << ctxpar_last_error();
    int first = -1;
    EXPECT_EQ(ctxpar_comm_world_ranks(world, &first), 2);
    EXPECT_EQ(first, 5);
    ctxpar_comm *comm = nullptr;
    EXPECT_EQ(ctxpar_comm_world_comm(world, 1, nullptr, &comm), CTXPAR_ERR_COMM);
    EXPECT_EQ(last_i, 1);
    EXPECT_EQ(ctxpar_comm_world_comm(world, 2, nullptr, &comm), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(made, 1) << "an out-of-range rank never reaches the kind";
    ctxpar_comm_world_destroy(world);
    EXPECT_EQ(created, 2);
    EXPECT_EQ(destroyed, 1);
}

} // namespace
