// What ddprun decides for the whole job, apart from how it learns what
// happened: events in, decisions out, no I/O. On one host the local
// coordinator feeds it this host's events; on several, node 0's coordinator
// feeds it every host's (the others report over the control channel, see
// wire.h) and passes each decision on to them.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace ddprun {

// Something that happened to the job, on host `node`.
struct Event {
  enum Kind {
    NodeJoined,       // node: its ddprun takes part (node 0's own included)
    JoinTimedOut,     // why: not every node joined within --rdzv-timeout
    WorkerFailed,     // node, attempt, code, why: one of its workers failed
    WorkersFinished,  // node, attempt: all of its workers exited 0
    WorkersStopped,   // node, attempt: its workers are gone after a Restart to `attempt`
    Aborted,          // node, code, why: its ddprun stops for good (a stop signal,
                      //   or it could not start workers)
    NodeLost,         // node, why: its ddprun closed the link or stopped answering
    LastCallOver,     // MIN:MAX: the last-call window after the MIN-th join has passed
  };
  Kind kind = NodeJoined;
  int node = 0;
  int attempt = 0;
  int code = 0;
  std::string why;

  static Event joined(int node);
  static Event join_timed_out(const std::string& error);
  static Event worker_failed(int node, int attempt, int code, const std::string& what);
  static Event workers_finished(int node, int attempt);
  static Event workers_stopped(int node, int attempt);
  static Event aborted(int node, int code, const std::string& what);
  static Event node_lost(int node, const std::string& how);
  static Event last_call_over();
};

// Whether `nodes` hold a quorum of an attempt that started with `last` (Note [A quorum
// of the last attempt]).
bool quorum_of(const std::set<int>& last, const std::set<int>& nodes);

// What every host does next.
struct Decision {
  enum Kind {
    Wait,      // nothing to do yet
    Start,     // start the workers of `attempt`
    Restart,   // stop the workers; `attempt` starts once every host's are gone
    Exit,      // stop the workers and exit with `code`
    LastCall,  // MIN:MAX: enough hosts joined; report LastCallOver after the last-call window
  };
  Kind kind = Wait;
  int attempt = 0;     // Start, Restart: the attempt to run next
  int code = 0;        // Exit: ddprun's exit code
  int node = -1;       // Restart, Exit: the node whose failure caused it, if any
  std::string run_id;  // Start
  // Start, Restart: the restarts that failures have used so far, out of --max-restarts
  // (TORCHELASTIC_RESTART_COUNT). A restart that admits a waiting host is not counted.
  int restarts = 0;
  std::string why;    // Restart, Exit: what failed, to print
  std::string error;  // Exit: a job-level error to print (e.g. a host never joined)
  // Start with MIN:MAX hosts: the nodes that take part, in group-rank order (a node's
  // GROUP_RANK is its index here). Empty with a fixed number of hosts: node n is group n.
  std::vector<int> members;
};

// The rules, for `nnodes` hosts (1 on a single host):
// - the workers start (attempt 0) once every node has joined;
// - the first failure of an attempt decides: a restart while fewer than
//   `max_restarts` restarts were used, else an exit with the worker's code;
//   later failures and successes of that attempt change nothing;
// - after a restart, the next attempt starts once every node has stopped;
// - the job succeeds (exit 0) once every node's workers finished in one attempt;
// - a stop signal or a lost node ends the job at once, never with a restart;
// - the first exit stands: nothing after it changes the decision.
// With a range of hosts (min_nodes < nnodes, torchrun's --nnodes MIN:MAX):
// - once min_nodes have joined, a LastCall; the workers start at LastCallOver, or
//   as soon as nnodes have joined, with the nodes joined by then as members;
// - a lost member leads to a restart of the others (a restart counts against
//   `max_restarts`) while at least min_nodes members remain, else to an exit;
// - a node that joins after the start, while there is room (fewer than nnodes), waits
//   and brings a restart of the running attempt, as torchrun's membership change does:
//   it becomes a member at the next start. This restart does not count against
//   `max_restarts`. While a restart is already under way, or once some node's workers
//   have finished, the node just waits for the next start; a lost waiting node changes
//   nothing;
// - a lost member ends the job unless the members left are a quorum of the attempt
//   started last (Note [A quorum of the last attempt]).
//
// Note [A quorum of the last attempt]
// A host cannot tell a dead peer from a network split: on either side of a split the
// others stop answering. If each side went on with the hosts it still sees, both would
// train and write the same checkpoints. So a side goes on only while it holds more than
// half of the hosts of the attempt started last, or exactly half of them with that
// attempt's group 0 among them (the tie goes to the side of the lowest node rank). At
// most one side of any split can hold such a quorum. The same rule lets the hosts left
// after node 0 is lost pick a new coordinator (take_over) without node 0 agreeing: if
// node 0 still runs on the other side of a split, it lacks the quorum and stops. The
// price: two of three hosts lost at once (before a restart) end the job, even when they
// really died, while one at a time they do not.
class JobPolicy {
 public:
  // `min_nodes` 0 means `nnodes` (a fixed number of hosts).
  JobPolicy(int nnodes, int max_restarts, std::string run_id, int min_nodes = 0);

  // The decision `e` leads to; Wait when it leads to none.
  Decision on(const Event& e);

  // MIN:MAX: this host (`self`) goes on as the coordinator after the coordinator `lost`
  // was lost, while `attempt` ran on `last_members` after `restarts_used` restarts.
  // `gone` (with `lost`) are members known lost since. Every other member counts as
  // present until a NodeLost says otherwise; the next attempt starts once all of them
  // have stopped (the Restart returned), or the job ends (Exit) when no restart is left,
  // too few nodes are, or they are no quorum.
  Decision take_over(int self, const std::vector<int>& last_members, const std::set<int>& gone,
                     int lost, int attempt, int restarts_used, const std::string& why);

  // Whether the workers were started once (every node joined).
  bool started() const { return attempt_ >= 0; }
  // Whether the job ends (an Exit was decided).
  bool over() const { return over_; }
  // Whether `node` takes part in the attempt started last (every joined node with a
  // fixed number of hosts).
  bool member(int node) const { return members_.count(node) > 0; }
  // Nodes joined or waiting to, members included; MIN:MAX admits up to nnodes.
  int present() const {
    return static_cast<int>(members_.size() + waiting_.size() +
                            (started() ? 0 : joined_nodes_.size()));
  }
  bool elastic() const { return min_nodes_ < nnodes_; }
  // Whether `nodes` hold a quorum of the attempt started last (Note [A quorum of the
  // last attempt]).
  bool quorum(const std::set<int>& nodes) const { return quorum_of(last_start_, nodes); }
  const std::string& run_id() const { return run_id_; }
  // The node rank the next host to join would get (c10d): above every node seen.
  int next_node() const;

 private:
  Decision start(int attempt);
  Decision restart(int attempt, int node, const std::string& why);
  Decision exit(int code, int node, const std::string& why);
  Decision member_lost(const Event& e);
  // An Exit when the members left are fewer than min_nodes or no quorum, else Wait.
  Decision too_few(int node, const std::string& why);
  bool all_members_in(const std::set<int>& nodes) const;

  const int nnodes_;
  const int min_nodes_;
  const int max_restarts_;
  const std::string run_id_;
  bool over_ = false;
  int attempt_ = -1;              // the attempt started last
  bool restart_decided_ = false;  // attempt_ failed and will be restarted
  int next_attempt_ = -1;         // the attempt a Restart decided on
  int restarts_used_ = 0;         // restarts decided for failures (not for joins)
  bool last_call_ = false;        // LastCall was decided
  std::set<int> joined_nodes_, finished_nodes_, stopped_nodes_;
  std::set<int> members_;     // the nodes of the attempt started last, less those lost since
  std::set<int> last_start_;  // the nodes of the attempt started last, as it started
  std::set<int> waiting_;     // joined after the start; members from the next start
};

}  // namespace ddprun
