// Note [Backend choice]
// Which Comm a group gets is decided here, and only here, in two steps:
//   1. choose_backend (from resolve_rendezvous, before any rank has met): the backend
//      the user named ("gloo", "nccl", "shm"), checked; or, left empty, "nccl" when
//      this build has NCCL and LibTorch sees a GPU, else an automatic CPU choice. The
//      device stand-in (DDP_DEVICE_STANDIN) turns "nccl" and the empty backend into
//      "standin". A backend that needs a GPU is refused here when there is none.
//   2. Comm::create (once the ranks have met and told each other their hosts, Note
//      [Same host]): the automatic CPU choice becomes "shm" when every rank shares one
//      host, "hier" (shared memory within hosts, Gloo between their leaders) when the
//      ranks span hosts and some host has several, else "gloo". World size 1 gets
//      LocalComm unless a real one-rank group is asked for (Note [World size 1]).
// What a Comm can then do is its own to say (Comm::reduces_dtype, reduces_in_place,
// trivial): no caller reads the backend's name to decide.

#include "distributed/backend_select.h"

#include "distributed/backends/c10d_comm.h"
#include "distributed/backends/device_standin.h"
#include "distributed/backends/hier_comm.h"
#include "distributed/backends/shm_comm.h"
#include "distributed/common/check.h"
#include "distributed/debug/traced_comm.h"
#include "distributed/rendezvous/host_identity.h"
#include "distributed/store_wait.h"

#include <ddp/errors.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

namespace ddp {
namespace detail {

void choose_backend(const std::string& asked, bool standin, CommConfig& c) {
  c.backend = asked;
  DDP_CHECK(c.backend.empty() || c.backend == "gloo" || c.backend == "nccl" || c.backend == "shm",
            "backend must be \"gloo\", \"nccl\" or \"shm\" (or empty, to choose by what "
            "is there), but got \"",
            c.backend, "\".");
  // Note [Device stand-in]: NCCL's contract on the host, for checks without a GPU.
  if (standin && (c.backend.empty() || c.backend == "nccl")) {
    enable_standin_device();
    c.backend = "standin";
  }
  if (c.backend.empty()) {
    c.backend = nccl_compiled() && cuda_available() ? "nccl" : "gloo";
    c.backend_auto = c.backend == "gloo";
  }
  DDP_CHECK(c.backend != "nccl" || nccl_compiled(),
            "backend \"nccl\" is not available: this ddp-cpp was built against a "
            "LibTorch without CUDA and NCCL. Use backend \"gloo\" (CPU), or rebuild "
            "against a CUDA LibTorch 2.x, e.g. -DCMAKE_PREFIX_PATH=$(python3 -c 'import "
            "torch; print(torch.utils.cmake_prefix_path)') (see docs/gpu.md).");
}

void check_backend_device(const CommConfig& c) {
  DDP_CHECK(c.backend != "nccl" || cuda_available(), "backend \"nccl\" needs a CUDA GPU, but rank ",
            c.rank, " sees none (",
            "LibTorch reports 0 CUDA devices: no GPU in this machine, no driver, or "
            "CUDA_VISIBLE_DEVICES hides them). Use backend \"gloo\" on CPUs, or an empty "
            "backend to choose by what is there.");
}

namespace {

// Note [Waiting that talks] for the rendezvous: each rank announces itself under
// ddp/arrived/<rank> and waits for all the others, saying whom it waits for, before the
// backend's own rendezvous (which waits silently and cannot say who is missing) starts.
// The announcement is the rank's host identity (Note [Same host]); all of them are
// returned, in rank order.
std::vector<HostIdentity> wait_for_arrivals(const CommConfig& c, Store& store) {
  try {
    store.set("ddp/arrived/" + std::to_string(c.rank), encode(local_host_identity()));
  } catch (const std::exception& e) {
    rethrow_comm_error(e, c, "announcing this rank at the rendezvous");
  }
  std::vector<std::string> keys;
  for (int r = 0; r < c.world_size; ++r) keys.push_back("ddp/arrived/" + std::to_string(r));
  const std::string where_text = store_description(c);
  KeyWait got;
  try {
    got = wait_for_keys([&store](const std::string& key) { return store.try_get(key); }, keys,
                        c.timeout, c.wait_report,
                        [&](const std::vector<size_t>& missing, std::chrono::seconds waited) {
                          std::vector<int> ranks(missing.begin(), missing.end());
                          return "[ddp] rank " + std::to_string(c.rank) + " of " +
                                 std::to_string(c.world_size) + " has waited " +
                                 std::to_string(waited.count()) + " s at " + where_text +
                                 " for rank(s) " + join_ranks(ranks) + " to join (timeout " +
                                 std::to_string(c.timeout.count() / 1000) + " s)";
                        });
  } catch (const std::exception& e) {
    rethrow_comm_error(e, c, "waiting for the other ranks at the rendezvous");
  }
  if (got.complete()) {
    std::vector<HostIdentity> ids(got.values.size());
    for (size_t r = 0; r < ids.size(); ++r) decode(*got.values[r], ids[r]);
    return ids;
  }
  std::vector<int> ranks(got.missing.begin(), got.missing.end());
  // Note [Signed store records]: a record that is there but failed its check.
  std::vector<int> refused;
  for (int r : ranks) {
    if (store.refused(keys[static_cast<size_t>(r)])) refused.push_back(r);
  }
  const std::string refusal =
      refused.empty()
          ? std::string()
          : " The record(s) of rank(s) " + join_ranks(refused) +
                " were there but refused: their signatures do not match this rank's job "
                "secret (DDP_SECRET_FILE). Give every rank the same secret; if they have it, "
                "a process without it wrote them (docs/security.md).";
  throw TimeoutError("rank " + std::to_string(c.rank) + " of " + std::to_string(c.world_size) +
                     " waited " + std::to_string(c.timeout.count()) + " ms at " + where_text +
                     " for the other ranks to join; rank(s) " + join_ranks(ranks) +
                     " never arrived. Start all " + std::to_string(c.world_size) +
                     " ranks with the same rendezvous settings (WORLD_SIZE counts every "
                     "process of the job), or raise the timeout." +
                     refusal);
}

std::string describe_host(const HostIdentity& id) {
  return "'" + (id.hostname.empty() ? std::string("?") : id.hostname) + "' (boot id " +
         (id.boot_id.empty() ? std::string("unknown") : id.boot_id.substr(0, 8)) + ", /dev/shm " +
         std::to_string(id.shm_device) + ":" + std::to_string(id.shm_inode) + ")";
}

// A shared-memory setup whose rendezvous keys live in `store`.
ShmSetup shm_setup_on(const std::shared_ptr<Store>& store) {
  ShmSetup setup;
  setup.store_set = [store](const std::string& k, const std::string& v) { store->set(k, v); };
  setup.store_try_get = [store](const std::string& k) { return store->try_get(k); };
  return setup;
}

// The "shm" backend when every rank shares this host, or nullptr for Gloo: backend ""
// falls back quietly (rank 0 says why when the segment could not be made); backend
// "shm" throws, saying which ranks are elsewhere or what failed.
std::unique_ptr<Comm> make_shm(const CommConfig& c, const std::shared_ptr<Store>& store,
                               const std::vector<HostIdentity>& ids) {
  const bool asked = c.backend == "shm";
  for (size_t r = 1; r < ids.size(); ++r) {
    if (same_shm_host(ids[0], ids[r])) continue;
    if (!asked) return nullptr;
    throw ProcessGroupError("backend \"shm\" on rank " + std::to_string(c.rank) + " of " +
                            std::to_string(c.world_size) +
                            ": shared memory needs every rank of the group on one host, but "
                            "rank 0 is on " +
                            describe_host(ids[0]) + " and rank " + std::to_string(r) + " on " +
                            describe_host(ids[r]) +
                            ". Use backend \"gloo\", or an empty backend, which picks shared "
                            "memory only when the ranks share a host.");
  }
  ShmSetup setup = shm_setup_on(store);
  setup.identities = ids;
  setup.make_fallback = [&c, &store]() {
    CommConfig g = c;
    g.backend = "gloo";
    return make_gloo_comm(g, store);
  };
  std::string why_not;
  auto comm = make_shm_comm(c, setup, &why_not);
  if (comm) return comm;
  if (asked) {
    throw ProcessGroupError("backend \"shm\" on rank " + std::to_string(c.rank) + " of " +
                            std::to_string(c.world_size) +
                            ": the shared memory segment could not be set up: " + why_not +
                            ". Use backend \"gloo\" instead.");
  }
  if (c.rank == 0) {
    std::fprintf(stderr, "[ddp] shared memory is not usable (%s); using gloo\n", why_not.c_str());
  }
  return nullptr;
}

// Note [Hierarchical all-reduce]: for an empty backend on CPUs, when the ranks span
// hosts and some host has several. nullptr when the hierarchy does not apply.
std::unique_ptr<Comm> make_hier(const CommConfig& c, const std::shared_ptr<Store>& store,
                                const std::vector<HostIdentity>& ids) {
  const HostLayout layout = host_layout(ids, c.rank);
  if (!wants_hierarchy(layout)) return nullptr;
  auto global = make_gloo_comm(c, store);
  std::unique_ptr<Comm> local;
  std::string why_not;
  if (layout.local_size > 1) {
    std::shared_ptr<Store> host_store =
        store->prefixed("ddp/hier/host" + std::to_string(layout.host));
    CommConfig lc = c;
    lc.rank = layout.local_rank;
    lc.world_size = layout.local_size;
    ShmSetup setup = shm_setup_on(host_store);
    for (int r : layout.host_ranks) setup.identities.push_back(ids[static_cast<size_t>(r)]);
    setup.make_fallback = [] { return std::unique_ptr<Comm>(); };  // all_reduce, broadcast only
    local = make_shm_comm(lc, setup, &why_not);
  }
  // All hosts or none: a host without shared memory makes every rank use plain Gloo.
  at::Tensor ok = at::full({1}, local || layout.local_size == 1 ? 1 : 0, at::kInt);
  std::vector<at::Tensor> flag{ok};
  global->all_reduce(flag, ReduceOp::MIN)->wait();
  if (ok.item<int>() == 0) {
    if (!why_not.empty()) {
      std::fprintf(stderr,
                   "[ddp] rank %d: shared memory is not usable on this host (%s); the group "
                   "uses gloo without the hierarchy\n",
                   c.rank, why_not.c_str());
    }
    if (local) local->shutdown();
    return global;
  }
  std::unique_ptr<Comm> leaders;
  if (layout.leader()) {
    CommConfig gc = c;
    gc.rank = layout.host;
    gc.world_size = layout.hosts;
    leaders = make_gloo_comm(gc, store->prefixed("ddp/hier/leaders"));
  }
  return make_hier_comm(c, layout, std::move(global), std::move(local), std::move(leaders));
}

// Note [Interface from peers]: the interface and local placement of a file:// group.
void place_from_peers(CommConfig& c, const std::vector<HostIdentity>& ids) {
  const LocalPlacement p = local_placement(ids, c.rank);
  if (c.local_world_size < 0) c.local_world_size = p.local_world_size;
  if (c.local_rank < 0) c.local_rank = p.local_rank;
  if (!c.interface_from_peers || !c.gloo_interface.empty()) return;  // GLOO_SOCKET_IFNAME
  std::string error;
  c.gloo_interface = choose_gloo_interface(ids, c.rank, &error);
  if (!error.empty()) {
    throw ProcessGroupError("rank " + std::to_string(c.rank) + " of " +
                            std::to_string(c.world_size) + " (" + c.init_method +
                            "): the ranks span hosts, and Gloo needs an interface that reaches "
                            "them all, but " +
                            error +
                            ". Set GLOO_SOCKET_IFNAME on every rank to the interface that "
                            "connects the hosts.");
  }
  if (c.gloo_interface.empty()) c.gloo_address = "127.0.0.1";
}

// Every collective is numbered and recorded (Note [Flight recorder]), and checked across
// ranks in debug mode (Note [Collective fingerprints]), unless both are off. The store
// and the identities stay with the Comm, for its subgroups (Note [Groups from the
// parent's store]).
std::unique_ptr<Comm> traced_and_seeded(std::unique_ptr<Comm> comm, const CommConfig& c,
                                        const std::shared_ptr<Store>& store,
                                        const std::vector<HostIdentity>& identities) {
  if (c.debug_detail || c.flight_recorder_entries != 0) {
    comm = std::make_unique<TracedComm>(std::move(comm));
  }
  GroupSeedAccess::seed(*comm, store, identities);
  return comm;
}

}  // namespace

std::unique_ptr<Comm> Comm::create(const CommConfig& config) {
  if (config.world_size == 1 && !config.single_rank_group) {
    std::unique_ptr<Comm> local = make_local_comm(config);
    return config.backend == "standin" ? make_standin_comm(std::move(local)) : std::move(local);
  }
  CommConfig c = config;

  const std::shared_ptr<Store> store = open_store(c);

  const std::vector<HostIdentity> identities = wait_for_arrivals(c, *store);
  if (c.placement_from_peers || c.interface_from_peers) place_from_peers(c, identities);

  auto traced = [&c, &store, &identities](std::unique_ptr<Comm> comm) {
    return traced_and_seeded(std::move(comm), c, store, identities);
  };
  try {
    if (c.backend == "shm" || c.backend_auto) {
      if (auto comm = make_shm(c, store, identities)) return traced(std::move(comm));
    }
    if (c.backend_auto) {
      if (auto comm = make_hier(c, store, identities)) return traced(std::move(comm));
    }
    if (c.backend == "gloo") return traced(make_gloo_comm(c, store));
    if (c.backend == "standin") return traced(make_standin_comm(make_gloo_comm(c, store)));
    if (c.backend == "nccl") return traced(make_nccl_comm(c, store));
  } catch (const std::exception& e) {
    if (classify_comm_failure(cause_text(e)) == CommFailure::kTimeout) {
      throw TimeoutError("rank " + std::to_string(c.rank) + " of " + std::to_string(c.world_size) +
                         " waited " + std::to_string(c.timeout.count()) + " ms at " +
                         store_description(c) +
                         " for the other ranks to join, and not all of them did. Start "
                         "all " +
                         std::to_string(c.world_size) +
                         " ranks with the same rendezvous settings, or raise the timeout. "
                         "Cause: " +
                         cause_text(e));
    }
    rethrow_comm_error(e, c, "creating the " + c.backend + " process group");
  }
  TORCH_INTERNAL_ASSERT(false, "backend '", c.backend, "' reached Comm::create unchecked");
}

// Note [Groups from the parent's store]
// new_group makes a group from its parent's rendezvous store, under the prefix
// "ddp/group/<id>/", where id counts the groups made from that parent (every rank makes
// them in the same order, as PyTorch requires): no new port, no rendezvous the user sees,
// and the members' host identities are the parent's, so no arrival round either. Only
// the members take part. The backend: the one named, else the parent's, except that a
// parent on CPUs (shm, hier, or chosen automatically) gives "shm" to a group whose
// members share one host (falling back to Gloo quietly, as init does) and Gloo to one
// that spans hosts. Creation ends with a barrier of the new group (PyTorch's ends with a
// store barrier), so that no member drops the group while another still connects. The
// new Comm keeps its own store and identities, so groups nest.
struct GroupSeed {
  std::shared_ptr<Store> store;
  std::vector<HostIdentity> identities;
  std::atomic<int> next_id{0};
};

void GroupSeedAccess::seed(Comm& comm, const std::shared_ptr<Store>& store,
                           const std::vector<HostIdentity>& identities) {
  comm.seed_ = std::make_shared<GroupSeed>();
  comm.seed_->store = store;
  comm.seed_->identities = identities;
}

int Comm::next_group_id() { return seed_ ? seed_->next_id++ : local_group_ids_++; }

std::unique_ptr<Comm> Comm::create_subgroup(const std::vector<int>& parent_ranks, int id,
                                            const std::string& backend,
                                            std::chrono::milliseconds timeout) {
  const CommConfig& p = config();
  CommConfig c = p;
  const auto me = std::find(parent_ranks.begin(), parent_ranks.end(), p.rank);
  TORCH_INTERNAL_ASSERT(me != parent_ranks.end(), "create_subgroup on a rank outside it");
  c.rank = static_cast<int>(me - parent_ranks.begin());
  c.world_size = static_cast<int>(parent_ranks.size());
  if (timeout.count() > 0) c.timeout = timeout;
  const bool cpu_parent = p.backend == "shm" || p.backend == "hier" || p.backend_auto;
  std::string chosen = backend.empty() ? (cpu_parent ? std::string() : p.backend) : backend;
  DDP_CHECK(chosen.empty() || chosen == "gloo" || chosen == "shm" || chosen == "nccl" ||
                chosen == "standin",
            "new_group: backend \"", chosen,
            "\" is not one of \"gloo\", \"shm\", \"nccl\" (or empty).");
  DDP_CHECK(chosen != "nccl" || p.backend == "nccl",
            "new_group: backend \"nccl\" needs a parent "
            "group on GPUs (nccl), but the parent's backend is \"",
            p.backend, "\".");
  c.backend_auto = chosen.empty();
  c.backend = chosen;
  if (c.world_size == 1 && !c.single_rank_group) {
    if (c.backend.empty()) c.backend = p.backend;
    std::unique_ptr<Comm> local = make_local_comm(c);
    return c.backend == "standin" ? make_standin_comm(std::move(local)) : std::move(local);
  }
  DDP_CHECK(seed_, "new_group: this group was not made by init_process_group or "
                   "ProcessGroup::create, so it has no store to make groups from.");
  const std::shared_ptr<Store> store =
      seed_->store->prefixed("ddp/group/" + std::to_string(id) + "/");
  std::vector<HostIdentity> ids;
  for (int r : parent_ranks) ids.push_back(seed_->identities[static_cast<size_t>(r)]);
  auto finish = [&](std::unique_ptr<Comm> comm) -> std::unique_ptr<Comm> {
    // A barrier of the new group before anyone uses or drops it, as PyTorch's new_group
    // ends with one: a member that has connected could otherwise close its end (drop
    // the group) while another member is still connecting, which fails there.
    comm->barrier();
    return traced_and_seeded(std::move(comm), c, store, ids);
  };
  try {
    if (c.backend == "shm" || c.backend_auto) {
      if (auto comm = make_shm(c, store, ids)) return finish(std::move(comm));
      c.backend = "gloo";
      c.backend_auto = false;
    }
    if (c.backend == "gloo") return finish(make_gloo_comm(c, store));
    if (c.backend == "standin") return finish(make_standin_comm(make_gloo_comm(c, store)));
    if (c.backend == "nccl") return finish(make_nccl_comm(c, store));
  } catch (const std::exception& e) {
    rethrow_comm_error(e, c, "creating group #" + std::to_string(id) + " (new_group)");
  }
  TORCH_INTERNAL_ASSERT(false, "backend '", c.backend, "' reached create_subgroup unchecked");
}

}  // namespace detail
}  // namespace ddp
