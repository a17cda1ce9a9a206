// JobPolicy, one table row per story of a job: the events in the order the
// coordinators feed them, and the decision each one must lead to.
#include "job_policy.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <ostream>
#include <string>
#include <vector>

#include "exit_codes.h"

namespace ddprun {
namespace {

// What a decision must be; only the fields that its kind uses are compared.
struct Expected {
  Decision::Kind kind = Decision::Wait;
  int attempt = 0;           // Start, Restart
  int code = 0;              // Exit
  int node = -1;             // Restart, Exit
  std::vector<int> members;  // Start with MIN:MAX hosts
};

struct Step {
  Event event;
  Expected expected;
};

struct Row {
  const char* name;
  int nnodes;
  int max_restarts;
  std::vector<Step> steps;
};

void PrintTo(const Row& row, std::ostream* os) { *os << row.name; }

// Events, as the coordinators report them.
Event joined(int node) { return Event::joined(node); }
Event failed(int node, int attempt, int code) {
  return Event::worker_failed(node, attempt, code, "rank 0 failed");
}
Event finished(int node, int attempt) { return Event::workers_finished(node, attempt); }
Event stopped(int node, int attempt) { return Event::workers_stopped(node, attempt); }
Event stop_signal(int node, int sig) {
  return Event::aborted(node, exit_code_for_signal(sig), "stopped by a signal");
}
Event lost(int node) { return Event::node_lost(node, "its ddprun closed the connection"); }
Event join_timeout() { return Event::join_timed_out("nodes 1 did not join"); }

// Decisions.
Expected wait() { return {}; }
Expected start(int attempt) { return {Decision::Start, attempt, 0, -1, {}}; }
Expected start_with(int attempt, std::vector<int> members) {
  return {Decision::Start, attempt, 0, -1, std::move(members)};
}
Expected last_call() { return {Decision::LastCall, 0, 0, -1, {}}; }
Expected restart(int attempt, int node) { return {Decision::Restart, attempt, 0, node, {}}; }
Expected exit_with(int code, int node) { return {Decision::Exit, 0, code, node, {}}; }
Expected success() { return exit_with(0, -1); }

std::string describe(Decision::Kind kind, int attempt, int code, int node) {
  switch (kind) {
    case Decision::Wait:
      return "Wait";
    case Decision::Start:
      return "Start attempt " + std::to_string(attempt);
    case Decision::Restart:
      return "Restart to attempt " + std::to_string(attempt) + " for node " + std::to_string(node);
    case Decision::Exit:
      return "Exit code " + std::to_string(code) + " for node " + std::to_string(node);
    case Decision::LastCall:
      return "LastCall";
  }
  return "?";
}

// clang-format off: one row per line, as a table
const std::vector<Row> kRows = {
    // One host.
    {"OneHostSucceeds", 1, 0, {{joined(0), start(0)}, {finished(0, 0), success()}}},
    {"FailureWithoutRestartsExitsWithWorkerCode",
     1,
     0,
     {{joined(0), start(0)}, {failed(0, 0, 5), exit_with(5, 0)}}},
    {"WorkerKilledBySignalGivesItsCode",
     1,
     0,
     {{joined(0), start(0)}, {failed(0, 0, exit_code_for_signal(SIGKILL)), exit_with(137, 0)}}},
    {"RestartsUntilBudgetIsSpent",
     1,
     2,
     {{joined(0), start(0)},
      {failed(0, 0, 7), restart(1, 0)},
      {stopped(0, 1), start(1)},
      {failed(0, 1, 7), restart(2, 0)},
      {stopped(0, 2), start(2)},
      {failed(0, 2, 7), exit_with(7, 0)}}},
    {"SucceedsAfterRestart",
     1,
     2,
     {{joined(0), start(0)},
      {failed(0, 0, 3), restart(1, 0)},
      {stopped(0, 1), start(1)},
      {finished(0, 1), success()}}},
    {"StoppedForAnotherAttemptIsIgnored",
     1,
     1,
     {{joined(0), start(0)},
      {failed(0, 0, 3), restart(1, 0)},
      {stopped(0, 2), wait()},
      {stopped(0, 1), start(1)}}},
    {"FirstSigintExits130WithoutRestart",
     1,
     3,
     {{joined(0), start(0)}, {stop_signal(0, SIGINT), exit_with(130, 0)}}},
    {"SigtermExits143",
     1,
     3,
     {{joined(0), start(0)}, {stop_signal(0, SIGTERM), exit_with(143, 0)}}},
    {"SecondSigintKeepsFirstDecision",
     1,
     3,
     {{joined(0), start(0)},
      {stop_signal(0, SIGINT), exit_with(130, 0)},
      {stop_signal(0, SIGINT), wait()},
      {failed(0, 0, exit_code_for_signal(SIGKILL)), wait()}}},
    {"SigintDuringRestartExits",
     1,
     2,
     {{joined(0), start(0)},
      {failed(0, 0, 4), restart(1, 0)},
      {stop_signal(0, SIGINT), exit_with(130, 0)},
      {stopped(0, 1), wait()}}},
    {"NoRendezvousFolderExits1",
     1,
     2,
     {{joined(0), start(0)},
      {Event::aborted(0, kExitError, "no temporary folder"), exit_with(1, 0)}}},
    {"SuccessAfterExitChangesNothing",
     1,
     0,
     {{joined(0), start(0)}, {failed(0, 0, 2), exit_with(2, 0)}, {finished(0, 0), wait()}}},

    // Several hosts.
    {"StartsOnceEveryNodeJoined",
     3,
     0,
     {{joined(0), wait()}, {joined(2), wait()}, {joined(1), start(0)}}},
    {"SuccessWaitsForEveryNode",
     3,
     0,
     {{joined(0), wait()},
      {joined(1), wait()},
      {joined(2), start(0)},
      {finished(0, 0), wait()},
      {finished(2, 0), wait()},
      {finished(2, 0), wait()},
      {finished(1, 0), success()}}},
    {"FailureOnAgentExitsWithItsCode",
     2,
     0,
     {{joined(0), wait()}, {joined(1), start(0)}, {failed(1, 0, 5), exit_with(5, 1)}}},
    {"RestartWaitsUntilEveryNodeStopped",
     2,
     2,
     {{joined(0), wait()},
      {joined(1), start(0)},
      {failed(0, 0, 4), restart(1, 0)},
      {stopped(1, 1), wait()},
      {stopped(0, 1), start(1)}}},
    {"FailureDuringRestartIsTheSameFailure",
     2,
     2,
     {{joined(0), wait()},
      {joined(1), start(0)},
      {failed(1, 0, 3), restart(1, 1)},
      {failed(0, 0, 143), wait()},
      {stopped(0, 1), wait()},
      {stopped(1, 1), start(1)},
      {failed(0, 1, 6), restart(2, 0)}}},
    {"LateReportOfEarlierAttemptIsIgnored",
     2,
     1,
     {{joined(0), wait()},
      {joined(1), start(0)},
      {failed(0, 0, 4), restart(1, 0)},
      {stopped(0, 1), wait()},
      {stopped(1, 1), start(1)},
      {failed(1, 0, 4), wait()},
      {finished(1, 0), wait()},
      {finished(1, 1), wait()},
      {finished(0, 1), success()}}},
    {"FinishedNodeTakesPartInRestart",
     2,
     1,
     {{joined(0), wait()},
      {joined(1), start(0)},
      {finished(0, 0), wait()},
      {failed(1, 0, 5), restart(1, 1)},
      {finished(1, 0), wait()},
      {stopped(0, 1), wait()},
      {stopped(1, 1), start(1)},
      {finished(1, 1), wait()},
      {finished(0, 1), success()}}},
    {"SigintOnAgentStopsJob",
     2,
     3,
     {{joined(0), wait()}, {joined(1), start(0)}, {stop_signal(1, SIGINT), exit_with(130, 1)}}},
    {"LostNodeExits1WithoutRestart",
     2,
     3,
     {{joined(0), wait()}, {joined(1), start(0)}, {lost(1), exit_with(kExitLinkLost, 1)}}},
    {"LostNodeDuringRestartExits1",
     2,
     3,
     {{joined(0), wait()},
      {joined(1), start(0)},
      {failed(0, 0, 4), restart(1, 0)},
      {stopped(0, 1), wait()},
      {lost(1), exit_with(kExitLinkLost, 1)},
      {stopped(1, 1), wait()}}},
    {"LostNodeAfterExitKeepsWorkerCode",
     2,
     0,
     {{joined(0), wait()},
      {joined(1), start(0)},
      {failed(0, 0, 5), exit_with(5, 0)},
      {lost(1), wait()}}},
    {"LostNodeBeforeStartExits1",
     3,
     0,
     {{joined(0), wait()},
      {joined(1), wait()},
      {lost(1), exit_with(kExitLinkLost, 1)},
      {joined(2), wait()}}},
    {"JoinTimeoutExits1",
     3,
     0,
     {{joined(0), wait()},
      {joined(2), wait()},
      {join_timeout(), exit_with(kExitLinkLost, -1)},
      {joined(1), wait()}}},
    {"JoinTimeoutAfterStartIsIgnored",
     2,
     0,
     {{joined(0), wait()},
      {joined(1), start(0)},
      {join_timeout(), wait()},
      {finished(0, 0), wait()},
      {finished(1, 0), success()}}},
};
// clang-format on

std::string members_text(const std::vector<int>& members) {
  std::string text;
  for (int n : members) text += " " + std::to_string(n);
  return "[" + text + " ]";
}

void expect_steps(JobPolicy& policy, const std::vector<Step>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    const Expected& want = steps[i].expected;
    const Decision got = policy.on(steps[i].event);
    const bool uses_attempt = want.kind == Decision::Start || want.kind == Decision::Restart;
    const bool uses_code = want.kind == Decision::Exit;
    const bool uses_node = want.kind == Decision::Restart || want.kind == Decision::Exit;
    const bool same = got.kind == want.kind && (!uses_attempt || got.attempt == want.attempt) &&
                      (!uses_code || got.code == want.code) &&
                      (!uses_node || got.node == want.node) &&
                      (want.kind != Decision::Start || got.members == want.members);
    EXPECT_TRUE(same) << "step " << i << ": expected "
                      << describe(want.kind, want.attempt, want.code, want.node)
                      << members_text(want.members) << ", got "
                      << describe(got.kind, got.attempt, got.code, got.node)
                      << members_text(got.members);
  }
}

class JobPolicyTable : public testing::TestWithParam<Row> {};

TEST_P(JobPolicyTable, DecidesEachStep) {
  const Row& row = GetParam();
  JobPolicy policy(row.nnodes, row.max_restarts, "run42");
  expect_steps(policy, row.steps);
}

INSTANTIATE_TEST_SUITE_P(Rows, JobPolicyTable, testing::ValuesIn(kRows),
                         [](const testing::TestParamInfo<Row>& info) {
                           return std::string(info.param.name);
                         });

// torchrun's --nnodes MIN:MAX: hosts come and go between attempts.
struct ElasticRow {
  const char* name;
  int min_nodes;
  int max_nodes;
  int max_restarts;
  std::vector<Step> steps;
};

void PrintTo(const ElasticRow& row, std::ostream* os) { *os << row.name; }
Event last_call_over() { return Event::last_call_over(); }

// clang-format off: one row per line, as a table
const std::vector<ElasticRow> kElasticRows = {
    {"StartsAfterLastCallWithMinNodes",
     2,
     3,
     0,
     {{joined(0), wait()},
      {joined(1), last_call()},
      {last_call_over(), start_with(0, {0, 1})},
      {finished(0, 0), wait()},
      {finished(1, 0), success()}}},
    {"StartsAtOnceWithMaxNodes",
     2,
     3,
     0,
     {{joined(0), wait()},
      {joined(1), last_call()},
      {joined(2), start_with(0, {0, 1, 2})},
      {last_call_over(), wait()}}},
    {"LastCallBeforeMinChangesNothing",
     2,
     3,
     0,
     {{joined(0), wait()},
      {last_call_over(), wait()},
      {joined(1), last_call()},
      {last_call_over(), start_with(0, {0, 1})}}},
    {"LostMemberRestartsTheOthers",
     2,
     3,
     3,
     {{joined(0), wait()},
      {joined(1), last_call()},
      {joined(2), start_with(0, {0, 1, 2})},
      {lost(2), restart(1, 2)},
      {stopped(0, 1), wait()},
      {stopped(1, 1), start_with(1, {0, 1})},
      {finished(1, 1), wait()},
      {finished(0, 1), success()}}},
    {"LostMemberBelowMinExits",
     2,
     3,
     3,
     {{joined(0), wait()},
      {joined(1), last_call()},
      {last_call_over(), start_with(0, {0, 1})},
      {lost(1), exit_with(kExitLinkLost, 1)}}},
    {"LostMemberWithoutRestartsLeftExits",
     2,
     3,
     0,
     {{joined(0), wait()},
      {joined(1), last_call()},
      {joined(2), start_with(0, {0, 1, 2})},
      {lost(1), exit_with(kExitLinkLost, 1)}}},
    {"LateHostIsAdmittedByARestartAtOnce",
     1,
     3,
     0,
     {
         {joined(0), last_call()},
         {last_call_over(), start_with(0, {0})},
         {joined(1), restart(1, -1)},  // no restarts left, yet a join restarts (torchrun)
         {joined(2), wait()},          // joins the restart under way
         {stopped(0, 1), start_with(1, {0, 1, 2})},
         {failed(1, 1, 4), exit_with(4, 1)},  // and the budget is still untouched: 0 of 0
     }},
    {"JoinAfterAFailureRestartJoinsIt",
     1,
     3,
     2,
     {{joined(0), last_call()},
      {last_call_over(), start_with(0, {0})},
      {failed(0, 0, 4), restart(1, 0)},
      {joined(1), wait()},
      {stopped(0, 1), start_with(1, {0, 1})},
      {finished(0, 1), wait()},
      {finished(1, 1), success()}}},
    {"NoAdmissionOnceAHostFinished",
     2,
     3,
     2,
     {{joined(0), wait()},
      {joined(1), last_call()},
      {last_call_over(), start_with(0, {0, 1})},
      {finished(1, 0), wait()},
      {joined(2), wait()},
      {finished(0, 0), success()}}},
    {"NoAdmissionBeyondMax",
     1,
     2,
     2,
     {{joined(0), last_call()},
      {joined(1), start_with(0, {0, 1})},
      {joined(2), wait()},
      {finished(0, 0), wait()},
      {finished(1, 0), success()}}},
    {"LostWhileRestartingMayBeTheLastAwaited",
     2,
     3,
     3,
     {{joined(0), wait()},
      {joined(1), last_call()},
      {joined(2), start_with(0, {0, 1, 2})},
      {failed(0, 0, 4), restart(1, 0)},
      {stopped(0, 1), wait()},
      {stopped(1, 1), wait()},
      {lost(2), start_with(1, {0, 1})}}},
    {"LostWaitingHostChangesNothing",
     1,
     3,
     1,
     {{joined(0), last_call()},
      {last_call_over(), start_with(0, {0})},
      {failed(0, 0, 4), restart(1, 0)},
      {joined(1), wait()},
      {lost(1), wait()},
      {stopped(0, 1), start_with(1, {0})}}},
    {"LostBeforeTheStartIsForgotten",
     2,
     3,
     0,
     {{joined(0), wait()},
      {joined(1), last_call()},
      {lost(1), wait()},
      {last_call_over(), wait()},
      {joined(2), last_call()},
      {last_call_over(), start_with(0, {0, 2})}}},
    // Note [A quorum of the last attempt]
    {"TwoOfThreeLostAtOnceAreNoQuorum",
     1,
     3,
     3,
     {{joined(0), last_call()},
      {joined(1), wait()},
      {joined(2), start_with(0, {0, 1, 2})},
      {lost(1), restart(1, 1)},
      {lost(2), exit_with(kExitLinkLost, 2)}}},  // node 0 alone may be the small side of a split
    {"OneAtATimeKeepsAQuorum",
     1,
     3,
     3,
     {{joined(0), last_call()},
      {joined(1), wait()},
      {joined(2), start_with(0, {0, 1, 2})},
      {lost(2), restart(1, 2)},
      {stopped(0, 1), wait()},
      {stopped(1, 1), start_with(1, {0, 1})},
      {lost(1), restart(2, 1)},  // half of {0, 1}, with group 0
      {stopped(0, 2), start_with(2, {0})}}},
    {"HalfWithoutGroupZeroIsNoQuorum",
     1,
     4,
     3,
     {{joined(0), last_call()},
      {joined(1), wait()},
      {joined(2), wait()},
      {joined(3), start_with(0, {0, 1, 2, 3})},
      {lost(3), restart(1, 3)},
      {lost(0), exit_with(kExitLinkLost, 0)}}},  // node 0's report never comes: a test of the rule
};
// clang-format on

class ElasticPolicyTable : public testing::TestWithParam<ElasticRow> {};

TEST_P(ElasticPolicyTable, DecidesEachStep) {
  const ElasticRow& row = GetParam();
  JobPolicy policy(row.max_nodes, row.max_restarts, "run42", row.min_nodes);
  expect_steps(policy, row.steps);
}

INSTANTIATE_TEST_SUITE_P(Rows, ElasticPolicyTable, testing::ValuesIn(kElasticRows),
                         [](const testing::TestParamInfo<ElasticRow>& info) {
                           return std::string(info.param.name);
                         });

TEST(JobPolicy, RestartCountCountsFailuresNotAdmissions) {
  JobPolicy policy(3, 2, "run42", 1);  // --nnodes 1:3 --max-restarts 2
  policy.on(joined(0));
  EXPECT_EQ(policy.on(last_call_over()).restarts, 0);
  const Decision admit = policy.on(joined(1));
  ASSERT_EQ(admit.kind, Decision::Restart);
  EXPECT_EQ(admit.node, -1);
  EXPECT_NE(admit.why.find("node 1 joined"), std::string::npos) << admit.why;
  const Decision second = policy.on(stopped(0, 1));
  EXPECT_EQ(second.attempt, 1);
  EXPECT_EQ(second.restarts, 0);  // TORCHELASTIC_RESTART_COUNT stays 0
  const Decision after_failure = policy.on(failed(1, 1, 3));
  ASSERT_EQ(after_failure.kind, Decision::Restart);
  EXPECT_EQ(after_failure.restarts, 1);
  policy.on(stopped(0, 2));
  const Decision third = policy.on(stopped(1, 2));
  EXPECT_EQ(third.kind, Decision::Start);
  EXPECT_EQ(third.attempt, 2);
  EXPECT_EQ(third.restarts, 1);
  // One restart left of 2: the next failure restarts, the one after ends the job.
  EXPECT_EQ(policy.on(failed(0, 2, 5)).kind, Decision::Restart);
  policy.on(stopped(0, 3));
  EXPECT_EQ(policy.on(stopped(1, 3)).restarts, 2);
  EXPECT_EQ(policy.on(failed(0, 3, 5)).kind, Decision::Exit);
}

TEST(JobPolicy, DecisionsCarryRunIdAndReasons) {
  JobPolicy policy(2, 1, "run42");
  policy.on(joined(0));
  Decision d = policy.on(joined(1));
  EXPECT_EQ(d.run_id, "run42");
  d = policy.on(Event::worker_failed(1, 0, 3, "rank 3 (pid 7 on b) failed with exit code 3"));
  EXPECT_EQ(d.why, "rank 3 (pid 7 on b) failed with exit code 3");
  policy.on(stopped(0, 1));
  d = policy.on(stopped(1, 1));
  ASSERT_EQ(d.kind, Decision::Start);
  EXPECT_EQ(d.run_id, "run42");  // every attempt of the job has the same run id
  d = policy.on(Event::aborted(1, 130, "stopped by SIGINT on b"));
  EXPECT_EQ(d.why, "stopped by SIGINT on b");
  EXPECT_TRUE(d.error.empty());
}

TEST(JobPolicy, JoinTimeoutIsAJobError) {
  JobPolicy policy(2, 0, "run42");
  policy.on(joined(0));
  const Decision d =
      policy.on(Event::join_timed_out("nodes 1 did not join within --rdzv-timeout 2 s"));
  EXPECT_EQ(d.kind, Decision::Exit);
  EXPECT_EQ(d.error, "nodes 1 did not join within --rdzv-timeout 2 s");
  EXPECT_TRUE(d.why.empty());
}

TEST(JobPolicy, QuorumOfTheLastAttempt) {
  EXPECT_TRUE(quorum_of({0, 1, 2}, {1, 2}));
  EXPECT_FALSE(quorum_of({0, 1, 2}, {2}));
  EXPECT_TRUE(quorum_of({0, 1}, {0}));   // half, with group 0 (the lowest node rank)
  EXPECT_FALSE(quorum_of({0, 1}, {1}));  // half, without it
  EXPECT_TRUE(quorum_of({1, 2, 5, 7}, {1, 7}));
  EXPECT_FALSE(quorum_of({1, 2, 5, 7}, {2, 5}));
  EXPECT_FALSE(quorum_of({0, 1, 2}, {3, 4}));  // hosts that joined later do not count
  EXPECT_FALSE(quorum_of({}, {}));
}

// Note [A new coordinator]: node 1 goes on after node 0 was lost during attempt 2.
TEST(JobPolicy, TakeOverRestartsTheMembersLeft) {
  JobPolicy policy(3, 3, "run42", 2);  // --nnodes 2:3 --max-restarts 3
  const Decision d =
      policy.take_over(1, {0, 1, 2}, {}, 0, 2, 1, "its ddprun closed the connection");
  ASSERT_EQ(d.kind, Decision::Restart);
  EXPECT_EQ(d.attempt, 3);
  EXPECT_EQ(d.node, 0);
  EXPECT_EQ(d.restarts, 2);  // the loss of node 0 counts as a restart
  EXPECT_TRUE(policy.started());
  EXPECT_TRUE(policy.member(1));
  EXPECT_TRUE(policy.member(2));
  EXPECT_FALSE(policy.member(0));
  EXPECT_EQ(policy.next_node(), 3);
  EXPECT_EQ(policy.on(stopped(2, 3)).kind, Decision::Wait);
  const Decision go = policy.on(stopped(1, 3));
  ASSERT_EQ(go.kind, Decision::Start);
  EXPECT_EQ(go.attempt, 3);
  EXPECT_EQ(go.members, (std::vector<int>{1, 2}));  // node 1 is group 0: MASTER_ADDR is its own
  EXPECT_EQ(go.restarts, 2);
  EXPECT_EQ(policy.on(finished(2, 3)).kind, Decision::Wait);
  EXPECT_EQ(policy.on(finished(1, 3)).kind, Decision::Exit);
}

TEST(JobPolicy, TakeOverWaitsForTheOthersOrLosesThem) {
  JobPolicy policy(4, 3, "run42", 1);  // --nnodes 1:4
  ASSERT_EQ(policy.take_over(1, {0, 1, 2, 3}, {}, 0, 0, 0, "lost").kind, Decision::Restart);
  EXPECT_EQ(policy.on(stopped(1, 1)).kind, Decision::Wait);
  EXPECT_EQ(policy.on(stopped(2, 1)).kind, Decision::Wait);
  // Node 3 never rejoins: {1, 2} is half of {0, 1, 2, 3} without group 0.
  const Decision d = policy.on(lost(3));
  ASSERT_EQ(d.kind, Decision::Exit);
  EXPECT_EQ(d.code, kExitLinkLost);
  EXPECT_NE(d.why.find("not a majority"), std::string::npos) << d.why;
}

TEST(JobPolicy, TakeOverRefusedWithoutQuorumRestartsOrMin) {
  {
    JobPolicy policy(2, 3, "run42", 1);  // two hosts: node 1 alone is half, without group 0
    const Decision d = policy.take_over(1, {0, 1}, {}, 0, 0, 0, "its ddprun stopped answering");
    ASSERT_EQ(d.kind, Decision::Exit);
    EXPECT_NE(d.why.find("its ddprun stopped answering"), std::string::npos) << d.why;
    EXPECT_NE(d.why.find("network split"), std::string::npos) << d.why;
  }
  {
    JobPolicy policy(3, 1, "run42", 1);
    const Decision d = policy.take_over(1, {0, 1, 2}, {}, 0, 0, 1, "lost");
    ASSERT_EQ(d.kind, Decision::Exit);
    EXPECT_NE(d.why.find("--max-restarts 1"), std::string::npos) << d.why;
  }
  {
    JobPolicy policy(3, 3, "run42", 3);  // MIN 3: two are too few
    const Decision d = policy.take_over(2, {0, 1, 2}, {}, 0, 0, 0, "lost");
    ASSERT_EQ(d.kind, Decision::Exit);
    EXPECT_NE(d.why.find("--nnodes MIN"), std::string::npos) << d.why;
  }
  {
    JobPolicy policy(5, 3, "run42", 1);  // node 1 was tried first and never listened
    const Decision d = policy.take_over(2, {0, 1, 2, 3, 4}, {1}, 0, 0, 0, "lost");
    ASSERT_EQ(d.kind, Decision::Restart);  // {2, 3, 4}: 3 of 5
    EXPECT_FALSE(policy.member(1));
  }
}

TEST(JobPolicy, StartedAndOver) {
  JobPolicy policy(2, 0, "run42");
  EXPECT_FALSE(policy.started());
  policy.on(joined(0));
  EXPECT_FALSE(policy.started());
  policy.on(joined(1));
  EXPECT_TRUE(policy.started());
  EXPECT_FALSE(policy.over());
  policy.on(finished(0, 0));
  EXPECT_FALSE(policy.over());
  policy.on(finished(1, 0));
  EXPECT_TRUE(policy.over());
}

}  // namespace
}  // namespace ddprun
