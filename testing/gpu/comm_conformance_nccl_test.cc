// The comm conformance suite on the NCCL comm: one rank per visible GPU (threads of this process,
// communicators from ncclCommInitAll; NCCL does not put two ranks of one communicator on one
// GPU), transfers in each rank's device memory. Without a GPU, or built without CUDA/NCCL, every
// case skips and says why. What only NCCL has (stream ordering, timeouts, abort) stays in
// nccl_comm_test.cc.
#include <string>

#include "testing/comm_conformance.h"
#include "testing/gpu/gpu_rule.h"

#if defined(CTXPAR_TEST_NO_CUDA) || defined(CTXPAR_TEST_NO_NCCL)

namespace cpt_commconf {
std::vector<CommWorld> CommWorlds() {
    return {{"nccl", [](const CommBody &) -> std::string {
                 return cpt_gpu::Unavailable("built without CUDA/NCCL");
             }}};
}
} // namespace cpt_commconf

#else

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <thread>

#include "ctxpar_cuda.h"
#include "ctxpar_nccl.h"

namespace cpt_commconf {
namespace {

std::string RunNccl(const CommBody &body) {
    if (!cpt_gpu::CudaReason().empty())
        return cpt_gpu::Unavailable(cpt_gpu::CudaReason());
    int n = 0;
    (void)cudaGetDeviceCount(&n); // CudaReason() saw it succeed
    // Threads of one process launch their own collectives: GROUP launch mode would make a rank
    // that fails early block the others on the host instead of timing out.
    setenv("NCCL_LAUNCH_MODE", "PARALLEL", 1);
    std::vector<ncclComm_t> nccl((size_t)n);
    const ncclResult_t init = ncclCommInitAll(nccl.data(), n, nullptr);
    if (init != ncclSuccess) // a GPU is there: a failure, not a skip
        return cpt_gpu::Unavailable(std::string("ncclCommInitAll: ") + ncclGetErrorString(init));
    std::vector<std::thread> threads;
    std::vector<int> aborted((size_t)n, 0);
    for (int r = 0; r < n; r++)
        threads.emplace_back([&, r] {
            ctxpar_cuda_options o = CTXPAR_CUDA_OPTIONS_INIT;
            o.device_ordinal = r;
            o.use_cudnn = CTXPAR_CUDA_CUDNN_OFF;
            ctxpar_device *dev = nullptr;
            ctxpar_comm *comm = nullptr;
            ASSERT_EQ(ctxpar_device_create_cuda(&o, &dev), CTXPAR_OK) << ctxpar_last_error();
            EXPECT_OK(ctxpar_comm_create_nccl(nccl[(size_t)r], dev, nullptr, &comm));
            if (comm) {
                EXPECT_OK(ctxpar_comm_set_timeout(comm, 30));
                body(r, n, comm, dev);
                EXPECT_OK(ctxpar_nccl_comm_aborted(comm, &aborted[(size_t)r]));
                ctxpar_comm_destroy(comm);
            }
            ctxpar_device_destroy(dev);
        });
    for (auto &t : threads)
        t.join();
    for (int r = 0; r < n; r++)
        if (!aborted[(size_t)r]) // an aborted communicator was already torn down
            ncclCommDestroy(nccl[(size_t)r]);
    return "";
}

} // namespace

std::vector<CommWorld> CommWorlds() { return {{"nccl", RunNccl}}; }

} // namespace cpt_commconf

#endif
