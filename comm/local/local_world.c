// The local comm's entry in the registry of comms by name: a world is one group, and every rank
// of the job runs in this process (as its own thread).
#include "local_internal.h"

static ctxpar_status world_create(int nranks, void **impl_out, int *first_rank_out,
                                  int *count_out) {
    if (nranks < 1)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "the local comm runs every rank in this process: nranks (%d) must be "
                            ">= 1",
                            nranks);
    ctxpar_local_group *group = NULL;
    CTXPAR_CHECK(ctxpar_local_group_create(nranks, &group));
    *impl_out = group;
    *first_rank_out = 0;
    *count_out = nranks;
    return CTXPAR_OK;
}

static ctxpar_status world_comm(void *impl, int i, ctxpar_device *copy_device,
                                ctxpar_comm **comm_out) {
    return ctxpar_comm_create_local(impl, i, copy_device, comm_out);
}

static void world_destroy(void *impl) { ctxpar_local_group_destroy(impl); }

static const ctxpar_comm_world_ops ops = {world_create, world_comm, world_destroy};

// First in the registry wherever the library is (the priority runs it before other comms').
__attribute__((constructor(101))) static void register_local(void) {
    if (ctxpar_comm_register("local", "ranks as threads of this process", &ops) != CTXPAR_OK)
        ctxpar_clear_error(); // already there: the first registration stands
}
