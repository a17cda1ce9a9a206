#include "options.h"

#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "sysinfo.h"

namespace ddprun {
namespace {

// Values are taken as text so that a bad one gets a message saying what was
// expected and what was seen, rather than a bare conversion error.
struct RawOptions {
  std::string nproc = "1", nnodes = "1", node_rank, master_port = "0";  // node_rank "": not given
  std::string rdzv_endpoint, rdzv_conf, local_ranks_filter = "all", start_method = "spawn";
  bool module = false, no_python = false, run_path = false;
  std::string rdzv_port = "0", rdzv_timeout = "300", max_restarts = "0";
  std::string monitor_interval = "0.1", redirect = "0", tee = "0", grace = "5";
  std::string make_secret;  // only in --help: main() runs `ddprun --make-secret FILE` itself
};

struct UsageError {
  std::string message;
};

int to_int(const std::string& flag, const std::string& text, long lo, long hi,
           const std::string& hint) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < lo || v > hi)
    throw UsageError{flag + " expects a whole number from " + std::to_string(lo) + " to " +
                     std::to_string(hi) + "; got '" + text + "'. " + hint};
  return static_cast<int>(v);
}

double to_seconds(const std::string& flag, const std::string& text, bool allow_zero) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !(v >= 0) || (!allow_zero && v == 0) || v > 1e7)
    throw UsageError{flag + " expects a number of seconds" + (allow_zero ? " >= 0" : " > 0") +
                     "; got '" + text + "'. Example: " + flag + " 2.5"};
  return v;
}

// torchrun's flags that ddprun does not take, each with what to do instead: a command
// line written for torchrun must fail clearly rather than run with a flag dropped.
struct Unsupported {
  const char* dashed;
  const char* instead;
};
constexpr Unsupported kUnsupported[] = {
    {"--event-log-handler", "ddprun writes its events to stderr; drop the flag"},
    {"--log-line-prefix-template",
     "ddprun prefixes lines with [rank N]: (or nothing with --no-prefix)"},
    {"--duplicate-stdout-filters", "filter the console output with grep, or use --log-dir"},
    {"--duplicate-stderr-filters", "filter the console output with grep, or use --log-dir"},
    {"--local-addr", "the hosts reach node 0 at the --rdzv-endpoint (or --master-addr) address"},
    {"--logs-specs", "use --log-dir with --redirect/--tee"},
    {"--numa-binding", "bind in the command: ddprun [OPTIONS] -- numactl --cpunodebind=N PROGRAM"},
    {"--signals-to-handle", "ddprun passes SIGINT, SIGTERM and SIGHUP on to the workers"},
    {"--virtual-local-rank", "each worker gets its own LOCAL_RANK; drop the flag"},
    {"--print-completion", "ddprun has no shell completion"},
    {"--use-env", "workers always get their rank in the environment (LOCAL_RANK); drop the flag"},
};

// The unsupported torchrun flag `name` is (dashed or underscored), or nullptr.
const Unsupported* unsupported(const std::string& name) {
  std::string dashed = name;
  for (size_t i = 2; i < dashed.size(); ++i)
    if (dashed[i] == '_') dashed[i] = '-';
  for (const Unsupported& u : kUnsupported)
    if (dashed == u.dashed) return &u;
  return nullptr;
}

int resolve_nproc(const std::string& spec) {
  if (spec == "xpu")
    throw UsageError{"--nproc-per-node xpu: ddprun does not count Intel XPUs. Give the number of "
                     "workers, e.g. --nproc-per-node 4."};
  if (spec == "cpu") return online_cpu_count();
  if (spec == "gpu" || spec == "auto") {
    int gpus = gpu_count();
    if (gpus > 0) return gpus;
    if (spec == "auto") return 1;
    throw UsageError{"--nproc-per-node gpu: no GPU found on this host (no /dev/nvidia[0-9]* "
                     "device, and CUDA_VISIBLE_DEVICES is unset or empty). Give a number, or "
                     "'auto' (one worker per GPU, else 1) or 'cpu' (one per core)."};
  }
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(spec.c_str(), &end, 10);
  if (spec.empty() || *end != '\0' || errno != 0 || v < 1 || v > 4096)
    throw UsageError{"--nproc-per-node expects a whole number from 1 to 4096, or one of auto, cpu, "
                     "gpu; got '" +
                     spec + "'. Example: --nproc-per-node 4"};
  return static_cast<int>(v);
}

// Splits argv where the worker command starts: after "--", or at the first word
// that is neither an option nor an option's value (as torchrun does), so that the
// program's own flags are never read as ddprun's.
size_t command_start(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") return i;
    if (arg.size() < 2 || arg[0] != '-') return i;
    const bool has_value = arg.find('=') != std::string::npos || (arg[1] != '-' && arg.size() > 2);
    const std::string name = arg[1] != '-' ? arg.substr(0, 2) : arg.substr(0, arg.find('='));
    if (const Unsupported* u = unsupported(name))
      throw UsageError{"torchrun's option '" + name +
                       "' is not supported by ddprun: " + u->instead + "."};
    const CLI::Option* opt = app.get_option_no_throw(name);
    if (!opt && name != "-h" && name != "--help")
      throw UsageError{"unknown option '" + name +
                       "'. Options for the worker program go after its "
                       "name (or after --): ddprun [OPTIONS] -- PROGRAM " +
                       arg};
    if (has_value || (opt && opt->get_items_expected_max() == 0)) continue;
    ++i;  // the option's value
  }
  return argc;
}

// --nnodes N, or torchrun's MIN:MAX range (sets min_nodes too).
void parse_nnodes(Options& o, const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    o.nnodes = o.min_nodes = to_int("--nnodes", text, 1, 65536, "Example: --nnodes 2");
    return;
  }
  const std::string hint = "Example: --nnodes 2 or --nnodes 2:4";
  o.min_nodes = to_int("--nnodes", text.substr(0, colon), 1, 65536, hint);
  o.nnodes = to_int("--nnodes", text.substr(colon + 1), 1, 65536, hint);
  if (o.min_nodes > o.nnodes) throw UsageError{"--nnodes " + text + ": MIN is above MAX. " + hint};
}

// --rdzv-conf key=value,...: the keys of torchrun's c10d rendezvous that ddprun uses.
void parse_rdzv_conf(Options& o, const std::string& conf) {
  size_t pos = 0;
  while (pos < conf.size()) {
    size_t end = conf.find(',', pos);
    if (end == std::string::npos) end = conf.size();
    const std::string item = conf.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (eq == std::string::npos)
      throw UsageError{"--rdzv-conf expects key=value pairs separated by commas; got '" + item +
                       "'. Example: --rdzv-conf join_timeout=600,last_call_timeout=30"};
    const std::string flag = "--rdzv-conf " + key;
    const std::string value = item.substr(eq + 1);
    if (key == "join_timeout")
      o.rdzv_timeout = to_seconds(flag, value, false);
    else if (key == "last_call_timeout")
      o.last_call_timeout = to_seconds(flag, value, true);
    else if (key == "close_timeout")
      o.close_timeout = to_seconds(flag, value, true);
    else if (key == "keep_alive_interval")
      o.keep_alive_interval = to_seconds(flag, value, false);
    else if (key == "keep_alive_max_attempt")
      o.keep_alive_max_attempt =
          to_int(flag, value, 1, 100000, "Example: --rdzv-conf keep_alive_max_attempt=15");
    else
      throw UsageError{"--rdzv-conf: unknown key '" + key +
                       "'. ddprun takes join_timeout, last_call_timeout, close_timeout, "
                       "keep_alive_interval (seconds) and keep_alive_max_attempt."};
  }
}

// --rdzv-endpoint HOST[:PORT] ([IPv6]:PORT too); torchrun's default port is 29400.
void parse_endpoint(Options& o, const std::string& endpoint) {
  std::string host = endpoint, port = "29400";
  if (!endpoint.empty() && endpoint[0] == '[') {
    const size_t close = endpoint.find(']');
    if (close == std::string::npos)
      throw UsageError{"--rdzv-endpoint '" + endpoint +
                       "' lacks the closing ']'. Example: [fe80::1]:29400"};
    host = endpoint.substr(1, close - 1);
    if (close + 1 < endpoint.size()) {
      if (endpoint[close + 1] != ':')
        throw UsageError{"--rdzv-endpoint '" + endpoint + "': expected :PORT after ']'"};
      port = endpoint.substr(close + 2);
    }
  } else if (endpoint.find(':') != std::string::npos && endpoint.find(':') == endpoint.rfind(':')) {
    host = endpoint.substr(0, endpoint.find(':'));
    port = endpoint.substr(endpoint.find(':') + 1);
  }
  if (host.empty())
    throw UsageError{"--rdzv-endpoint '" + endpoint +
                     "' names no host. Example: --rdzv-endpoint 10.0.0.1:29400"};
  o.master_addr = host;
  o.rdzv_port =
      to_int("--rdzv-endpoint port", port, 1, 65535, "Example: --rdzv-endpoint 10.0.0.1:29400");
}

// "all", or local ranks separated by commas (torchrun's --local-ranks-filter).
std::vector<int> parse_local_ranks(const std::string& text) {
  std::vector<int> ranks;
  if (text == "all" || text.empty()) return ranks;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    ranks.push_back(to_int("--local-ranks-filter", text.substr(pos, end - pos), 0, 4095,
                           "Example: --local-ranks-filter 0,1"));
    pos = end + 1;
  }
  return ranks;
}

// The rendezvous flags, torchrun's way: c10d hands out node ranks and takes node 0's
// address and port from --rdzv-endpoint; static is ddprun's --node-rank/--master-addr.
void check_rendezvous(Options& o, const RawOptions& raw) {
  if (o.rdzv_backend != "static" && o.rdzv_backend != "c10d")
    throw UsageError{
        "--rdzv-backend '" + o.rdzv_backend +
        "' is not supported; ddprun takes static "
        "(each host gives --node-rank) or c10d (node ranks handed out as hosts join)."};
  parse_rdzv_conf(o, raw.rdzv_conf);
  if (o.rdzv_backend == "static") {
    if (o.min_nodes < o.nnodes)
      throw UsageError{
          "--nnodes " + raw.nnodes +
          ": a range of hosts (MIN:MAX) needs --rdzv-backend c10d "
          "and --rdzv-endpoint; with static node ranks give one number, e.g. --nnodes " +
          std::to_string(o.nnodes) + "."};
    if (!raw.rdzv_endpoint.empty())
      throw UsageError{
          "--rdzv-endpoint goes with --rdzv-backend c10d. With static node ranks, give "
          "node 0's address and port as --master-addr and --master-port."};
    o.node_rank = raw.node_rank.empty()
                      ? 0
                      : to_int("--node-rank", raw.node_rank, 0, 65535, "Example: --node-rank 1");
    return;
  }
  if (!raw.node_rank.empty())
    std::cerr << "ddprun: note: --node-rank is not used with --rdzv-backend c10d; node ranks are "
                 "handed out in the order the hosts join.\n";
  o.node_rank = 0;  // node 0 unless another host serves the endpoint (then set at rendezvous)
  if (raw.rdzv_endpoint.empty()) {
    if (o.nnodes > 1)
      throw UsageError{"--rdzv-backend c10d with --nnodes " + std::to_string(o.nnodes) +
                       " needs "
                       "--rdzv-endpoint HOST[:PORT], an address of the host that is to be node 0. "
                       "Example: --rdzv-endpoint 10.0.0.1:29400"};
    return;
  }
  if (o.nnodes > 1) parse_endpoint(o, raw.rdzv_endpoint);
}

// torchrun runs the training script with Python unless --no-python. ddprun also runs
// native programs (its main use), so Python is put in front for -m, --run-path and a
// program whose name ends in .py; --no-python runs even those directly.
void add_interpreter(Options& o, const RawOptions& raw) {
  if (raw.no_python && (raw.module || raw.run_path))
    throw UsageError{std::string("--no-python cannot go with ") +
                     (raw.module ? "-m/--module" : "--run-path") +
                     ": those run the program with Python."};
  const std::string& program = o.command[0];
  const bool script = program.size() > 3 && program.compare(program.size() - 3, 3, ".py") == 0;
  if (raw.no_python || !(raw.module || raw.run_path || script)) return;
  const char* chosen = std::getenv("DDPRUN_PYTHON");
  std::vector<std::string> command{chosen && *chosen ? chosen : "python3"};
  if (raw.module) command.push_back("-m");
  command.insert(command.end(), o.command.begin(), o.command.end());
  o.command = std::move(command);
}

void check(Options& o, const RawOptions& raw) {
  parse_nnodes(o, raw.nnodes);
  o.master_port =
      to_int("--master-port", raw.master_port, 0, 65535, "Example: --master-port 29500");
  o.rdzv_port = to_int("--rdzv-port", raw.rdzv_port, 0, 65535, "Example: --rdzv-port 29501");
  o.rdzv_timeout = to_seconds("--rdzv-timeout", raw.rdzv_timeout, false);
  o.max_restarts =
      to_int("--max-restarts", raw.max_restarts, 0, 1000000, "Example: --max-restarts 3");
  o.monitor_interval = to_seconds("--monitor-interval", raw.monitor_interval, false);
  o.grace_period = to_seconds("--grace-period", raw.grace, true);
  const std::string streams = "Use 0 (none), 1 (stdout), 2 (stderr) or 3 (both).";
  o.redirect = to_int("--redirect", raw.redirect, 0, 3, streams);
  o.tee = to_int("--tee", raw.tee, 0, 3, streams);
  check_rendezvous(o,
                   raw);  // after --rdzv-port/--rdzv-timeout, which the endpoint and conf override
  o.local_ranks_filter = parse_local_ranks(raw.local_ranks_filter);
  if (raw.start_method != "spawn" && raw.start_method != "fork" && raw.start_method != "forkserver")
    throw UsageError{"--start-method expects spawn, fork or forkserver; got '" + raw.start_method +
                     "'"};
  if (o.standalone) {
    if (o.nnodes != 1 || o.node_rank != 0)
      throw UsageError{"--standalone runs one host, but --nnodes " + std::to_string(o.nnodes) +
                       " --node-rank " + std::to_string(o.node_rank) +
                       " was given. Drop --standalone, or drop --nnodes/--node-rank."};
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
  }
  if (o.node_rank >= o.nnodes)
    throw UsageError{"--node-rank " + std::to_string(o.node_rank) +
                     " is out of range for --nnodes " + std::to_string(o.nnodes) +
                     ": expected 0 <= node-rank < nnodes. Give each host " +
                     "a different --node-rank from 0 to " + std::to_string(o.nnodes - 1) + "."};
  for (char c : o.run_id)
    if (isspace(static_cast<unsigned char>(c)) || !isprint(static_cast<unsigned char>(c)))
      throw UsageError{"--run-id must not hold spaces or control characters; got '" + o.run_id +
                       "'. Example: --run-id job42"};
  if (o.master_addr.empty())
    throw UsageError{"--master-addr is empty. Example: --master-addr 10.0.0.1"};
  if (o.multi_host() && o.master_port == 0) o.master_port = 29500;
  if (o.multi_host() && o.rdzv_port == 0) {
    if (o.master_port == 65535)
      throw UsageError{"--master-port 65535 leaves no room for the agents' port (master port + 1). "
                       "Pick a lower --master-port or set --rdzv-port."};
    o.rdzv_port = o.master_port + 1;
  }
  o.nproc_per_node = resolve_nproc(o.nproc_spec);
  if (o.command.empty())
    throw UsageError{"no worker program given. Usage: ddprun [OPTIONS] [--] PROGRAM [ARGS...]"};
  if (o.role.empty() || o.role.find_first_of(" \t\n=") != std::string::npos)
    throw UsageError{"--role must be one word; got '" + o.role + "'. Example: --role trainer"};
  add_interpreter(o, raw);
}

}  // namespace

std::optional<Options> parse_options(int argc, char** argv, int& exit_code) {
  Options o;
  RawOptions raw;
  CLI::App app{
      "ddprun: starts PROGRAM once per local rank with the torchrun environment (RANK, "
      "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), prefixes each output line with "
      "[rank N]:, and stops every worker when one fails.\n"
      "Several hosts: run ddprun on each with the same --nnodes, --master-addr and "
      "--master-port and a different --node-rank; node 0 also listens on --rdzv-port so that "
      "the hosts stop (or restart) together. Or, as torchrun, the same command on every host: "
      "--rdzv-backend c10d --rdzv-endpoint HOST:PORT (node ranks handed out as hosts join; "
      "--nnodes MIN:MAX lets hosts come and go).",
      "ddprun"};
  app.footer(
      "Worker program: ddprun [OPTIONS] [--] PROGRAM [ARGS...]; everything after -- (or from the\n"
      "first word that is not an option) is the program and its own arguments.\n"
      "Exit code: 0 when every worker exits 0; else the first failed worker's code (128 + signal\n"
      "number when killed); 128 + signal when ddprun is interrupted; 2 for bad options; 126/127\n"
      "when the program cannot be run; 1 when a host is lost.\n"
      "Example: ddprun --nproc-per-node 4 ./train --epochs 3");
  app.get_formatter()->column_width(44);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as argparse does
  app.add_option("--nproc-per-node,--nproc_per_node", raw.nproc,
                 "Workers on this host: a number, auto (one per GPU, else 1), cpu (one per core) "
                 "or gpu (one per GPU)")
      ->capture_default_str()
      ->type_name("N|auto|cpu|gpu");
  app.add_option("--nnodes", raw.nnodes, "Number of hosts (N, or N:N)")
      ->capture_default_str()
      ->type_name("N");
  app.add_option("--node-rank,--node_rank", raw.node_rank,
                 "Index of this host, 0 to nnodes-1 (static rendezvous)")
      ->default_str("0")
      ->type_name("N");
  app.add_option("--rdzv-backend,--rdzv_backend", o.rdzv_backend,
                 "static: each host gives --node-rank; c10d: the same command on every host, node "
                 "ranks handed out in join order by the host that listens on --rdzv-endpoint")
      ->capture_default_str()
      ->type_name("static|c10d");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", raw.rdzv_endpoint,
                 "c10d: HOST[:PORT] of node 0, where it waits for the other hosts (port 29400 "
                 "if not given); MASTER_ADDR is HOST")
      ->type_name("HOST[:PORT]");
  app.add_option("--rdzv-conf,--rdzv_conf", raw.rdzv_conf,
                 "Rendezvous settings in seconds: join_timeout (as --rdzv-timeout), "
                 "last_call_timeout, close_timeout")
      ->type_name("KEY=VALUE,...");
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "Address of node 0, given to workers as MASTER_ADDR")
      ->capture_default_str()
      ->type_name("ADDR");
  app.add_option("--master-port,--master_port", raw.master_port,
                 "Port given to workers as MASTER_PORT; 0 picks a free port on one host, and "
                 "means 29500 with --nnodes > 1")
      ->capture_default_str()
      ->type_name("PORT");
  app.add_option("--rdzv-port,--rdzv_port", raw.rdzv_port,
                 "TCP port on --master-addr where node 0's ddprun waits for the other hosts' "
                 "ddprun; 0 means master port + 1")
      ->capture_default_str()
      ->type_name("PORT");
  app.add_option("--rdzv-timeout,--rdzv_timeout", raw.rdzv_timeout,
                 "Seconds to wait for all hosts to join (at the start and at each restart)")
      ->capture_default_str()
      ->type_name("SECONDS");
  app.add_option("--max-restarts,--max_restarts", raw.max_restarts,
                 "Times to restart all workers (on every host) after a failure")
      ->capture_default_str()
      ->type_name("N");
  app.add_option("--monitor-interval,--monitor_interval", raw.monitor_interval,
                 "Seconds between checks of the workers")
      ->capture_default_str()
      ->type_name("SECONDS");
  app.add_option("--log-dir,--log_dir", o.log_dir,
                 "Write worker output to LOG_DIR/<restart>/rank<RANK>/{stdout,stderr}.log; "
                 "alone it implies --tee 3")
      ->default_str("none")
      ->type_name("DIR");
  app.add_option("--redirect,--redirects,-r", raw.redirect,
                 "Send worker streams only to the log files: 0 none, 1 stdout, 2 stderr, 3 both")
      ->capture_default_str()
      ->type_name("0-3");
  app.add_option("--tee,-t", raw.tee,
                 "Send worker streams to the log files and to the console: 0 none, 1 stdout, "
                 "2 stderr, 3 both")
      ->capture_default_str()
      ->type_name("0-3");
  app.add_flag("--standalone", o.standalone,
               "One host: nnodes 1 on 127.0.0.1 with a free port [default: off]");
  app.add_option("--grace-period,--grace_period", raw.grace,
                 "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str()
      ->type_name("SECONDS");
  app.add_flag("--no-prefix,--no_prefix", o.no_prefix,
               "Do not prefix output lines with [rank N]: [default: off]");
  app.add_option("--role", o.role, "Worker role, given as ROLE_NAME")
      ->capture_default_str()
      ->type_name("NAME");
  app.add_flag(
      "-m,--module", raw.module,
      "Run PROGRAM as a Python module: python3 -m PROGRAM (the interpreter is $DDPRUN_PYTHON, "
      "else python3 on PATH) [default: off]");
  app.add_flag("--no-python,--no_python", raw.no_python,
               "Run PROGRAM directly, even when its name ends in .py [default: off]");
  app.add_flag("--run-path,--run_path", raw.run_path,
               "Run PROGRAM as a Python script whatever its name [default: off]");
  app.add_option("--local-ranks-filter,--local_ranks_filter", raw.local_ranks_filter,
                 "Local ranks whose output is shown on the console, e.g. 0,1 (log files keep all)")
      ->capture_default_str()
      ->type_name("all|R,R,...");
  app.add_option("--start-method,--start_method", raw.start_method,
                 "Accepted for torchrun's command lines; every worker is a new process (fork+exec)")
      ->capture_default_str()
      ->type_name("spawn|fork|forkserver");
  app.add_option("--shutdown-timeout,--shutdown_timeout", raw.grace, "Same as --grace-period")
      ->type_name("SECONDS");
  app.add_option("--rdzv-id,--rdzv_id", o.run_id,
                 "torchrun's name for --run-id; with c10d every host must give the same")
      ->type_name("ID");
  app.add_option("--run-id,--run_id", o.run_id,
                 "Job id given as TORCHELASTIC_RUN_ID and DDP_RUN_ID (node 0's wins)")
      ->default_str("random")
      ->type_name("ID");
  app.add_option("--rdzv-secret-file,--rdzv_secret_file", o.secret_file,
                 "Several hosts: the job secret (64+ hex digits, mode 0600) that every host "
                 "gives, so that only they can join or steer the job (docs/security.md); "
                 "default $DDPRUN_SECRET_FILE")
      ->default_str("none")
      ->type_name("FILE");
  app.add_option("--make-secret,--make_secret", raw.make_secret,
                 "Write a new job secret (32 random bytes as hex, mode 0600) to FILE and exit; "
                 "never replaces a file. Alone: ddprun --make-secret FILE")
      ->type_name("FILE");

  try {
    size_t split = command_start(app, argc, argv);
    std::vector<std::string> args;
    for (size_t i = split; i-- > 1;) args.push_back(argv[i]);
    size_t first =
        split < static_cast<size_t>(argc) && std::string(argv[split]) == "--" ? split + 1 : split;
    for (size_t i = first; i < static_cast<size_t>(argc); ++i) o.command.push_back(argv[i]);
    app.parse(args);  // CLI11 takes the arguments in reverse order
    o.nproc_spec = raw.nproc;
    o.run_id_given = app.count("--run-id") + app.count("--rdzv-id") > 0;
    if (app.count("--make-secret") > 0)
      throw UsageError{"--make-secret FILE goes alone: 'ddprun --make-secret FILE' writes a new "
                       "secret and exits, and starts no program."};
    if (o.secret_file.empty()) {
      const char* file = std::getenv("DDPRUN_SECRET_FILE");
      if (file) o.secret_file = file;
    }
    check(o, raw);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    exit_code = 0;
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprun: error: " << e.what() << "\nRun 'ddprun --help' for the options.\n";
    exit_code = kExitUsage;
    return std::nullopt;
  } catch (const UsageError& e) {
    std::cerr << "ddprun: error: " << e.message << "\nRun 'ddprun --help' for the options.\n";
    exit_code = kExitUsage;
    return std::nullopt;
  }
  if (!o.log_dir.empty() && o.redirect == 0 && o.tee == 0) o.tee = 3;
  std::string why;
  o.program_path = find_program(o.command[0], why, exit_code);
  if (o.program_path.empty()) {
    std::cerr << "ddprun: error: cannot start the worker program: " << why
              << ". Check the name, give its path (e.g. ./" << o.command[0]
              << "), or add its folder to PATH. No worker was started.\n";
    return std::nullopt;
  }
  return o;
}

bool Options::shows_local_rank(int local_rank) const {
  if (local_ranks_filter.empty()) return true;
  for (int r : local_ranks_filter)
    if (r == local_rank) return true;
  return false;
}

std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << seconds << " s";
  return text.str();
}

}  // namespace ddprun
