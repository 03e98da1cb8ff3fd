// Splitting a local comm: every rank learns every rank's (color, key) by one allreduce over the
// parent, the first member of each color makes the new group, and a second allreduce hands its
// address to the other members. Both go through the parent, so a rank that does not arrive or
// has failed gives TIMEOUT or REMOTE exactly as the parent's own ops do.
#include <stdint.h>
#include <stdlib.h>

#include "local_internal.h"

// Whether parent rank a comes before b in their new comm: by key, then by parent rank.
static int before(const int64_t *keys, int a, int b) {
    return keys[a] != keys[b] ? keys[a] < keys[b] : a < b;
}

ctxpar_status ctxpar_local_split(ctxpar_comm *comm, int color, int key, ctxpar_comm **comm_out) {
    local_comm *c = (local_comm *)comm->impl;
    const int p = comm->size, me = comm->rank;
    // [0, p): colors, [p, 2p): keys, [2p, 3p): the group addresses. A SUM of vectors that are
    // zero except at each rank's own slot is an allgather of one value per rank.
    int64_t *all = calloc(3 * (size_t)p, sizeof *all);
    if (!all)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "split: cannot allocate %d ranks' colors", p);
    int64_t my_color = color < 0 ? -1 : color;
    all[me] = my_color;
    all[p + me] = key;
    ctxpar_status st = ctxpar_comm_allreduce_i64(comm, all, 2 * (size_t)p, CTXPAR_REDUCE_SUM);
    int n = 0, newrank = 0, leader = -1;
    for (int r = 0; st == CTXPAR_OK && my_color >= 0 && r < p; r++) {
        if (all[r] != my_color)
            continue;
        n++;
        if (r != me && before(all + p, r, me))
            newrank++;
        if (leader < 0 || before(all + p, r, leader))
            leader = r;
    }
    ctxpar_local_group *g = NULL;
    if (st == CTXPAR_OK && leader == me) {
        // A failure here is told to the other members by the address 0.
        if (ctxpar_local_group_create(n, &g) == CTXPAR_OK) {
            g->self_owned = 1;
            g->to_attach = n;
        }
        all[2 * p + me] = (int64_t)(intptr_t)g;
    }
    if (st == CTXPAR_OK)
        st = ctxpar_comm_allreduce_i64(comm, all + 2 * p, (size_t)p, CTXPAR_REDUCE_SUM);
    if (st == CTXPAR_OK && my_color >= 0) {
        g = (ctxpar_local_group *)(intptr_t)all[2 * p + leader];
        if (!g)
            st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                              "split: rank %d could not make the group of color %d (%d ranks)",
                              leader, color, n);
        else
            st = ctxpar_comm_create_local(g, newrank, c->dev, comm_out);
    } else if (st == CTXPAR_OK) {
        *comm_out = NULL;
    }
    // (A leader whose second allreduce failed leaves its group to the members that got the
    // address; if none did, the group is lost: a failed split on a dying comm.)
    free(all);
    return st;
}
