// The comm worlds of the in-process suite: the local comm (ranks as threads) for P in
// {1, 2, 3, 4, 8}, and the fault-injecting decorator (testing/fault_comm.h) around it in
// pass-through mode. The MPI comm's world is in comm_conformance_mpi_test.cc (under mpirun). A
// new comm that runs in one process gets the suite by adding its world here.
#include <thread>

#include "ctxpar_local.h"
#include "testing/comm_conformance.h"
#include "testing/fault_comm.h"

namespace cpt_commconf {
namespace {

// Runs body on P threads, each with its rank's comm of one group (wrapped by the fault
// decorator when `fault` is set), then destroys them.
std::string RunLocal(int P, bool fault, const CommBody &body) {
    ctxpar_local_group *group = nullptr;
    if (ctxpar_local_group_create(P, &group) != CTXPAR_OK)
        return std::string("cannot create a local group: ") + ctxpar_last_error();
    std::vector<std::thread> threads;
    for (int r = 0; r < P; r++)
        threads.emplace_back([&, r] {
            ctxpar_comm *local = nullptr, *outer = nullptr;
            ASSERT_EQ(ctxpar_comm_create_local(group, r, nullptr, &local), CTXPAR_OK)
                << ctxpar_last_error();
            EXPECT_OK(ctxpar_comm_set_timeout(local, 30));
            outer = local;
            if (fault) {
                const cpt_fault none = {CPT_FAULT_NONE, 0, 0, 0.0, 0};
                EXPECT_OK(cpt_comm_create_fault(local, &none, &outer));
            }
            if (outer)
                body(r, P, outer, nullptr);
            if (outer != local)
                ctxpar_comm_destroy(outer);
            ctxpar_comm_destroy(local);
        });
    for (auto &t : threads)
        t.join();
    ctxpar_local_group_destroy(group);
    return "";
}

} // namespace

std::vector<CommWorld> CommWorlds() {
    std::vector<CommWorld> w;
    for (int P : {1, 2, 3, 4, 8})
        w.push_back({"local_" + std::to_string(P),
                     [P](const CommBody &body) { return RunLocal(P, false, body); }});
    for (int P : {1, 3, 4})
        w.push_back({"fault_passthrough_" + std::to_string(P),
                     [P](const CommBody &body) { return RunLocal(P, true, body); }});
    return w;
}

} // namespace cpt_commconf
