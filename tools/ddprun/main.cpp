// ddprun: the process launcher of ddp-cpp (torchrun's counterpart for C++).
#include <sys/prctl.h>

#include <iostream>

#include "control_channel.h"
#include "coordinator.h"
#include "options.h"
#include "signals.h"
#include "supervisor.h"
#include "sysinfo.h"
#include "worker_env.h"

int main(int argc, char** argv) {
  using namespace ddprun;
  int exit_code = 0;
  std::optional<Options> parsed = parse_options(argc, argv, exit_code);
  if (!parsed) return exit_code;
  Options& o = *parsed;
  o.command_line = shell_quoted(argc, argv);

  install_signal_pipe();
  // Orphaned descendants of the workers become ddprun's children, so they can
  // be reaped (no zombies) and found when the job ends.
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  if (o.run_id.empty()) o.run_id = random_hex_id(6);
  if (!o.multi_host() && o.master_port == 0) {
    o.master_port = pick_free_port();
    if (o.master_port == 0) {
      std::cerr << "ddprun: error: could not find a free port on 127.0.0.1; pass --master-port.\n";
      return kExitError;
    }
  }
  const std::string omp = default_omp_threads(o.nproc_per_node);
  if (!omp.empty())
    std::cerr << "ddprun: OMP_NUM_THREADS is not set; giving each of the " << o.nproc_per_node
              << " worker(s) OMP_NUM_THREADS=" << omp << " (" << affinity_cpu_count()
              << " cores here). Set it yourself to change this.\n";

  std::unique_ptr<Coordinator> coordinator;
  if (!o.multi_host())
    coordinator = make_local_coordinator(o.max_restarts, o.run_id);
  else if (o.dynamic_rank())
    coordinator = make_c10d_coordinator(o, o.run_id, exit_code);
  else if (o.node_rank == 0)
    coordinator = make_node0_coordinator(o, o.run_id, exit_code);
  else
    coordinator = make_agent_coordinator(o, exit_code);
  if (!coordinator) return exit_code;

  Supervisor supervisor(o, *coordinator, omp);
  return supervisor.run();
}
