// SPDX-License-Identifier: Apache-2.0
// Scatter writes (wire/scatter.h) over TCP, two engines in this
// process: writes of many short runs travel as a few acked active messages
// and land byte for byte; the target's handler refuses whatever does not fit
// its region or names another engine, and writes nothing then.
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"
#include "engine_agent.h"
#include "engines/ucx/ucx_worker.h"
#include "it_support.h"
#include "wire/fence.h"
#include "wire/scatter.h"
#include "wire/ucx_blob.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using internal::Engine;
using internal::PeerHandle;
using internal::XferHandle;
namespace ucx = internal::ucx;

constexpr std::uint64_t kBlocks = 64;
constexpr std::uint64_t kBlockLen = 16 * 1024;

// An engine over TCP with this file's geometry.
struct Agent : EngineAgent {
  Agent(std::string agent_name, std::map<std::string, std::string> engine_config, std::uint64_t gen,
        bool progress_thread = true)
      : EngineAgent(std::move(agent_name), with_tcp(std::move(engine_config)), kBlocks, kBlockLen,
                    gen, progress_thread) {}

  static std::map<std::string, std::string> with_tcp(std::map<std::string, std::string> config) {
    config["TLS"] = "tcp";
    // The UCX lane itself, over UCX's tcp transport (the only one with puts
    // here), not the tcp lane remote peers get by default.
    config["KVXFER_LANES"] = "ucx";
    return config;
  }
};

// Every block of `agent` still holds the pattern of `gen`.
bool untouched(const Agent& agent, std::uint64_t gen) {
  for (std::uint64_t i = 0; i < kBlocks; ++i) {
    if (first_mismatch(agent.pool.block(i), kBlockLen, gen, i) >= 0) return false;
  }
  return true;
}

// Writes `local` -> `remote` from `src` to `dst` and expects it to land.
void write_and_verify(Agent& src, Agent& dst, const std::vector<std::int64_t>& local,
                      const std::vector<std::int64_t>& remote) {
  PeerHandle peer = 0;
  ASSERT_EQ(src.engine->connect(dst.engine->local_blob(), dst.region(), &peer), Status::kSuccess);
  XferHandle xfer = 0;
  ASSERT_EQ(src.engine->post_write(peer, 1, local, remote, &xfer), Status::kSuccess);
  const auto [check, state] = wait_state(*src.engine, xfer);
  EXPECT_EQ(check, Status::kSuccess);
  EXPECT_EQ(state, Status::kSuccess);
  for (std::size_t i = 0; i < local.size(); ++i) {
    EXPECT_TRUE(bytes_equal(src.pool.block(static_cast<std::uint64_t>(local[i])),
                            dst.pool.block(static_cast<std::uint64_t>(remote[i])), kBlockLen))
        << i;
  }
  EXPECT_EQ(src.engine->release(xfer), Status::kSuccess);
  EXPECT_EQ(src.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(src.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

std::vector<std::int64_t> shuffled(std::uint64_t seed) {
  std::vector<std::int64_t> v(kBlocks);
  for (std::uint64_t i = 0; i < kBlocks; ++i) v[i] = static_cast<std::int64_t>(i);
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

TEST(UcxScatterTest, ShortRunsGoAsAFewAckedMessagesAndLand) {
  Agent a("scatter-a", {{"KVXFER_SCATTER_CHUNK", "256K"}}, 1);
  Agent b("scatter-b", {}, 2);
  // 64 random 16 KiB blocks (1 MiB): four 256 KiB messages, not 64 puts.
  write_and_verify(a, b, shuffled(1), shuffled(2));
  EXPECT_EQ(a.counter("scatter_writes"), 1u);
  EXPECT_EQ(a.counter("scatter_messages"), 4u);
  EXPECT_EQ(a.counter("put_writes"), 0u);
  EXPECT_EQ(b.counter("scatter_received"), 4u);
  EXPECT_EQ(b.counter("scatter_rejected"), 0u);
}

TEST(UcxScatterTest, PostsAreHandedToTheProgressThreadUnlessInline) {
  // Default: post_write only queues; the progress thread sends and the
  // caller's check() sees the bytes land without anyone calling progress().
  Agent a("scatter-a", {}, 1);
  Agent b("scatter-b", {}, 2);
  write_and_verify(a, b, shuffled(5), shuffled(6));
  EXPECT_EQ(a.counter("scatter_writes"), 1u);
  EXPECT_EQ(a.counter("scatter_handed_off"), 1u);
  // KVXFER_POST=inline: sent by post_write on the caller's thread.
  Agent in("scatter-inline", {{"KVXFER_POST", "inline"}}, 3);
  write_and_verify(in, b, shuffled(7), shuffled(8));
  EXPECT_EQ(in.counter("scatter_writes"), 1u);
  EXPECT_EQ(in.counter("scatter_handed_off"), 0u);
}

TEST(UcxScatterTest, HandedOffPostsKeepTheirPairsOrTheirRunsAndLandExactlyEither) {
  // A handed-off post keeps scattered blocks as pairs and long runs as runs
  // (its first pairs decide), and the progress thread builds the messages
  // from either. Lists whose start misleads the choice land as exactly.
  Agent a("scatter-a", {{"KVXFER_SCATTER_CHUNK", "64K"}}, 1);
  // The first 20 pairs one run, then scattered blocks; and the other way
  // round (blocks land in the block of the same index).
  std::vector<std::int64_t> run_then_scattered(kBlocks);
  std::vector<std::int64_t> scattered_then_run(kBlocks);
  for (std::uint64_t i = 0; i < kBlocks; ++i) {
    run_then_scattered[i] = static_cast<std::int64_t>(i);
    scattered_then_run[i] = static_cast<std::int64_t>((i + 48) % kBlocks);
  }
  std::mt19937_64 rng(31);
  std::shuffle(run_then_scattered.begin() + 20, run_then_scattered.end(), rng);
  std::shuffle(scattered_then_run.begin(), scattered_then_run.begin() + 16, rng);
  struct Case {
    std::vector<std::int64_t> local;
    std::vector<std::int64_t> remote;
    bool pairs;  // kept as pairs (else as runs)
  };
  std::vector<std::int64_t> identity(kBlocks);
  for (std::uint64_t i = 0; i < kBlocks; ++i) identity[i] = static_cast<std::int64_t>(i);
  const std::vector<Case> cases = {
      {shuffled(33), shuffled(34), true},
      {identity, identity, false},
      {run_then_scattered, run_then_scattered, false},
      {scattered_then_run, scattered_then_run, true},
      {{5}, {60}, true},
  };
  std::uint64_t gen = 10;
  for (const Case& c : cases) {
    Agent b("scatter-b", {}, ++gen);
    const std::uint64_t pairs0 = a.counter("handed_off_as_pairs");
    write_and_verify(a, b, c.local, c.remote);
    EXPECT_EQ(a.counter("handed_off_as_pairs") - pairs0, c.pairs ? 1u : 0u) << c.local.size();
    // Nothing but the blocks written changed.
    std::vector<bool> written(kBlocks, false);
    for (const std::int64_t r : c.remote) written[static_cast<std::size_t>(r)] = true;
    for (std::uint64_t i = 0; i < kBlocks; ++i) {
      if (!written[i]) {
        EXPECT_LT(first_mismatch(b.pool.block(i), kBlockLen, gen, i), 0) << i;
      }
    }
  }
  EXPECT_EQ(a.counter("scatter_handed_off"), cases.size());
  // Inline posts build on the caller's thread and keep nothing for later.
  Agent in("scatter-inline", {{"KVXFER_POST", "inline"}}, 3);
  Agent b("scatter-b", {}, 4);
  write_and_verify(in, b, shuffled(35), shuffled(36));
  EXPECT_EQ(in.counter("handed_off_as_pairs"), 0u);
}

// The first line of /proc/self/task/*/`file` of every thread of this
// process named `name`; of /proc/<tid>/`file` with `by_tid` (files such as
// timerslack_ns that the task directories leave out).
std::vector<std::string> file_of_threads_named(const std::string& name, const char* file,
                                               bool by_tid = false) {
  std::vector<std::string> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string thread_name;
    if (!std::getline(comm, thread_name) || thread_name != name) continue;
    std::ifstream in(by_tid ? std::filesystem::path("/proc") / task.path().filename() / file
                            : task.path() / file);
    std::getline(in, out.emplace_back());
  }
  return out;
}

// The fields of /proc/self/task/*/stat of every thread of this process
// named `name`, from field 3 on (after the command in parentheses): field
// N of proc(5) is element N - 3.
std::vector<std::vector<std::string>> stat_of_threads_named(const std::string& name) {
  std::vector<std::vector<std::string>> out;
  for (const std::string& stat : file_of_threads_named(name, "stat")) {
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    auto& row = out.emplace_back();
    for (std::string field; fields >> field;) row.push_back(field);
  }
  return out;
}

// The nice value (field 19) of every thread of this process named `name`.
std::vector<int> nice_of_threads_named(const std::string& name) {
  std::vector<int> out;
  for (const auto& fields : stat_of_threads_named(name)) {
    if (fields.size() > 19 - 3) out.push_back(std::stoi(fields[19 - 3]));
  }
  return out;
}

// CPU time in clock ticks (utime + stime, fields 14 and 15) of every thread
// of this process named `name`.
long cpu_ticks_of_threads_named(const std::string& name) {
  long total = 0;
  for (const auto& fields : stat_of_threads_named(name)) {
    if (fields.size() > 15 - 3) total += std::stol(fields[14 - 3]) + std::stol(fields[15 - 3]);
  }
  return total;
}

TEST(UcxScatterTest, ProgressThreadIsNamedAndTakesTheNiceValueAsked) {
  errno = 0;
  const int ours = ::getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  const int asked = std::min(ours + 3, 19);  // raising one's nice needs no privilege
  Agent a("scatter-nice", {{"KVXFER_PROGRESS_NICE", std::to_string(asked)}}, 1);
  Agent b("scatter-b", {}, 2);
  // The thread sets it first thing; give it the time to start.
  std::vector<int> nices;
  for (const auto deadline = std::chrono::steady_clock::now() + 5s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(1ms)) {
    nices = nice_of_threads_named("kvxfer-progress");
    if (nices.size() == 2 && std::count(nices.begin(), nices.end(), asked) >= 1) break;
  }
  ASSERT_EQ(nices.size(), 2u);  // a's and b's
  if (asked != ours) {
    EXPECT_EQ(std::count(nices.begin(), nices.end(), asked), 1);
    EXPECT_EQ(std::count(nices.begin(), nices.end(), ours), 1);  // b's, inherited
  }
  // Both take a timer slack of 1 us, so that a nap or a linger step ends
  // on time (the default is 50 us, a whole step).
  const std::string slack = std::to_string(ucx::UcxWorker::kTimerSlackNs);
  EXPECT_EQ(file_of_threads_named("kvxfer-progress", "timerslack_ns", /*by_tid=*/true),
            std::vector<std::string>({slack, slack}));
  write_and_verify(a, b, shuffled(11), shuffled(12));
}

TEST(UcxScatterTest, RunsLongerThanAMessageAreSplitAcrossMessages) {
  // 4 KiB messages: every 16 KiB block spans four of them, and the runs of
  // consecutive blocks (0..9 -> 40..49) span forty.
  Agent a("scatter-a", {{"KVXFER_SCATTER_CHUNK", "4K"}, {"KVXFER_SCATTER_MAX_RUN", "1M"}}, 1);
  Agent b("scatter-b", {}, 2);
  std::vector<std::int64_t> local = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 30, 12, 63};
  std::vector<std::int64_t> remote = {40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 3, 17, 0};
  write_and_verify(a, b, local, remote);
  EXPECT_EQ(a.counter("scatter_messages"), local.size() * 4);
  EXPECT_EQ(b.counter("scatter_received"), local.size() * 4);
}

TEST(UcxScatterTest, ATransferReusedAfterALargerOneSendsOnlyItsOwnRuns) {
  // Transfers are pooled and their message buffers keep their high-water
  // size: a small write after a large one must send its own runs and no
  // leftover of the large one's.
  Agent a("scatter-a", {{"KVXFER_SCATTER_CHUNK", "4K"}}, 1);
  Agent b("scatter-b", {}, 2);
  Agent c("scatter-c", {}, 3);
  std::vector<std::int64_t> all(kBlocks);
  for (std::uint64_t i = 0; i < kBlocks; ++i) all[i] = static_cast<std::int64_t>(i);
  write_and_verify(a, b, all, shuffled(21));
  EXPECT_EQ(a.counter("scatter_messages"), kBlocks * 4);
  write_and_verify(a, c, {5}, {9});
  EXPECT_EQ(a.counter("scatter_messages"), kBlocks * 4 + 4);
  EXPECT_EQ(c.counter("scatter_received"), 4u);
  for (std::uint64_t i = 0; i < kBlocks; ++i) {
    if (i == 9) continue;
    EXPECT_LT(first_mismatch(c.pool.block(i), kBlockLen, 3, i), 0) << "block " << i;
  }
  write_and_verify(a, c, {7, 8, 40, 41, 42, 3}, {20, 21, 22, 50, 51, 0});
  EXPECT_EQ(a.counter("scatter_messages"), kBlocks * 4 + 4 + 6 * 4);
}

// Progresses b (which has no progress thread) until a's transfer `xfer`
// to it ends, or 20 s pass; returns its last state.
Status progress_until_ended(Agent& a, Agent& b, XferHandle xfer) {
  Status state = Status::kInProgress;
  for (const auto deadline = std::chrono::steady_clock::now() + 20s;
       state == Status::kInProgress && std::chrono::steady_clock::now() < deadline;) {
    b.engine->progress();
    EXPECT_EQ(a.engine->check(xfer, &state), Status::kSuccess);
  }
  return state;
}

// Posts `writes` writes of one block each from `a` to `b` (whose worker
// only moves when the test progresses it), `gap` apart; then progresses b
// until every write landed. Returns a's progress_wakes over the posts.
std::uint64_t wakes_over_spaced_posts(Agent& a, Agent& b, int writes,
                                      std::chrono::milliseconds gap) {
  PeerHandle peer = 0;
  EXPECT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &peer), Status::kSuccess);
  // Until b has taken the connection, a's worker has events at every turn
  // (its thread goes round without sleeping); from then on b is silent.
  for (const auto until = std::chrono::steady_clock::now() + 10 * gap;
       std::chrono::steady_clock::now() < until;) {
    b.engine->progress();
  }
  std::this_thread::sleep_for(gap);
  const std::uint64_t wakes0 = a.counter("progress_wakes");
  std::vector<XferHandle> xfers;
  for (int w = 0; w < writes; ++w) {
    XferHandle xfer = 0;
    const std::vector<std::int64_t> local{w};
    const std::vector<std::int64_t> remote{static_cast<std::int64_t>(kBlocks) - 1 - w};
    EXPECT_EQ(a.engine->post_write(peer, static_cast<TransferId>(w + 1), local, remote, &xfer),
              Status::kSuccess);
    xfers.push_back(xfer);
    std::this_thread::sleep_for(gap);
  }
  const std::uint64_t wakes = a.counter("progress_wakes") - wakes0;
  for (const XferHandle xfer : xfers) {
    EXPECT_EQ(progress_until_ended(a, b, xfer), Status::kSuccess);
    EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  }
  for (int w = 0; w < writes; ++w) {
    EXPECT_TRUE(bytes_equal(a.pool.block(static_cast<std::uint64_t>(w)),
                            b.pool.block(kBlocks - 1 - static_cast<std::uint64_t>(w)), kBlockLen))
        << w;
  }
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  return wakes;
}

TEST(UcxScatterTest, PostsWhileRequestsAreInFlightDoNotWakeTheProgressThread) {
  // b acks nothing until the test progresses it, so a's first write stays
  // in flight and a's thread naps (5 ms here): the posts after it, 2 ms
  // apart, are only queued (no syscall on the caller's thread), and the end
  // of each nap sends them.
  Agent a("scatter-a", {{"KVXFER_NAP_US", "5000"}}, 1);
  Agent b("scatter-b", {}, 2, /*progress_thread=*/false);
  EXPECT_LE(wakes_over_spaced_posts(a, b, 6, 2ms), 1u);
}

TEST(UcxScatterTest, WithoutANapEveryPostToASleepingThreadWakesIt) {
  Agent a("scatter-a", {{"KVXFER_NAP_US", "0"}}, 1);
  Agent b("scatter-b", {}, 2, /*progress_thread=*/false);
  // 20 ms apart, the thread is asleep at nearly every post.
  EXPECT_GE(wakes_over_spaced_posts(a, b, 6, 20ms), 4u);
}

TEST(UcxScatterTest, RequestsThatGoQuietLetTheThreadSleepAndPostsWakeIt) {
  // A write to a silent peer: after a few naps without an event the thread
  // sleeps until woken (a nap every 200 us would cost ~10% of a core for as
  // long as the peer stays silent), so each later post wakes it.
  Agent a("scatter-a", {}, 1);
  Agent b("scatter-b", {}, 2, /*progress_thread=*/false);
  EXPECT_GE(wakes_over_spaced_posts(a, b, 6, 50ms), 4u);
}

// What a's progress thread did over posts made after idle periods.
struct IdlePosts {
  std::uint64_t wakes = 0;        // progress_wakes
  std::uint64_t lingers = 0;      // progress_lingers
  std::uint64_t linger_hits = 0;  // progress_linger_hits
};

// Posts `writes` writes of one block each from `a` to `b` (which has its
// own progress thread), each after the one before it ended and `gap`
// passed, so that a's lane has nothing in flight at each post. Returns a's
// counters over the posts after the first.
IdlePosts over_posts_after_idle(Agent& a, Agent& b, int writes, std::chrono::milliseconds gap) {
  PeerHandle peer = 0;
  EXPECT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &peer), Status::kSuccess);
  IdlePosts before;
  for (int w = 0; w < writes; ++w) {
    if (w == 1) {
      before = {a.counter("progress_wakes"), a.counter("progress_lingers"),
                a.counter("progress_linger_hits")};
    }
    XferHandle xfer = 0;
    const std::vector<std::int64_t> local{w};
    const std::vector<std::int64_t> remote{static_cast<std::int64_t>(kBlocks) - 1 - w};
    EXPECT_EQ(a.engine->post_write(peer, static_cast<TransferId>(w + 1), local, remote, &xfer),
              Status::kSuccess);
    Status state = Status::kInProgress;
    for (const auto deadline = std::chrono::steady_clock::now() + 20s;
         state == Status::kInProgress && std::chrono::steady_clock::now() < deadline;) {
      EXPECT_EQ(a.engine->check(xfer, &state), Status::kSuccess);
      std::this_thread::sleep_for(50us);
    }
    EXPECT_EQ(state, Status::kSuccess) << w;
    EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
    EXPECT_TRUE(bytes_equal(a.pool.block(static_cast<std::uint64_t>(w)),
                            b.pool.block(kBlocks - 1 - static_cast<std::uint64_t>(w)), kBlockLen))
        << w;
    std::this_thread::sleep_for(gap);
  }
  const IdlePosts over{a.counter("progress_wakes") - before.wakes,
                       a.counter("progress_lingers") - before.lingers,
                       a.counter("progress_linger_hits") - before.linger_hits};
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  return over;
}

TEST(UcxScatterTest, PostsSoonAfterTheLaneWentIdleFindTheThreadLingeringAndNeedNoWake) {
  // Each write ends before the next is posted, 5 ms later: inside a's
  // linger (0.1 s here), its thread still naps and takes each post at
  // the end of a step, with no wake.
  Agent a("scatter-a", {{"KVXFER_LINGER_US", "100000"}, {"KVXFER_LINGER_STEP_US", "1000"}}, 1);
  Agent b("scatter-b", {}, 2);
  const IdlePosts over = over_posts_after_idle(a, b, 6, 5ms);
  EXPECT_LE(over.wakes, 1u);
  EXPECT_GE(over.linger_hits, 4u);
}

TEST(UcxScatterTest, PostsAfterTheLingerWakeTheThread) {
  // Past the linger (1 ms here), the thread sleeps: costs no CPU, and each
  // post wakes it.
  Agent a("scatter-a", {{"KVXFER_LINGER_US", "1000"}}, 1);
  Agent b("scatter-b", {}, 2);
  const IdlePosts over = over_posts_after_idle(a, b, 6, 30ms);
  EXPECT_GE(over.wakes, 4u);
  EXPECT_EQ(over.linger_hits, 0u);
}

TEST(UcxScatterTest, LingersThatCatchNoPostAreSkippedMoreAndMoreOften) {
  // Posts 10 ms apart never come inside a 1 ms linger: after k lingers in a
  // row that caught nothing, the next 2^k - 1 idle periods sleep at once.
  // Over 16 idle periods that is 4 lingers (periods 1, 3, 7 and 15), not 16.
  Agent a("scatter-a", {{"KVXFER_LINGER_US", "1000"}}, 1);
  Agent b("scatter-b", {}, 2);
  const IdlePosts over = over_posts_after_idle(a, b, 17, 10ms);
  EXPECT_GE(over.wakes, 12u);
  EXPECT_EQ(over.linger_hits, 0u);
  EXPECT_LE(over.lingers, 6u);
  EXPECT_GE(over.lingers, 2u);
}

TEST(UcxScatterTest, ALingeringThreadGoesToSleepWhenTheLingerEnds) {
  // After a burst of writes, both progress threads linger (naps every
  // 50 us by default) and then sleep: a second later they use no CPU.
  Agent a("scatter-a", {{"KVXFER_LINGER_US", "20000"}}, 1);
  Agent b("scatter-b", {}, 2);
  std::vector<std::int64_t> all(kBlocks);
  for (std::uint64_t i = 0; i < kBlocks; ++i) all[i] = static_cast<std::int64_t>(i);
  write_and_verify(a, b, all, shuffled(5));
  std::this_thread::sleep_for(200ms);
  const long before = cpu_ticks_of_threads_named("kvxfer-progress");
  std::this_thread::sleep_for(1s);
  const long spent = cpu_ticks_of_threads_named("kvxfer-progress") - before;
  // Napping every 50 us all along would cost several ticks a second.
  EXPECT_LE(spent, 1) << spent << " ticks in 1 s";
}

TEST(UcxScatterTest, AConnectionThePeerHasNotTakenDoesNotSpinTheProgressThread) {
  // Until b's worker takes the connection, UCX reports the endpoint's
  // socket ready at every look; a's thread used to spin a whole core on it
  // (all of it) for as long as b stayed silent.
  Agent a("scatter-a", {}, 1);
  Agent b("scatter-b", {}, 2, /*progress_thread=*/false);
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &peer), Status::kSuccess);
  std::this_thread::sleep_for(200ms);
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  const long before = cpu_ticks_of_threads_named("kvxfer-progress");  // a's only
  std::this_thread::sleep_for(2s);
  const long spent = cpu_ticks_of_threads_named("kvxfer-progress") - before;
  // The spin was a whole core (2 s of ticks); the backoff costs a few %.
  EXPECT_LE(spent, ticks_per_second) << spent << " ticks in 2 s";
  // The connection still works once b takes it.
  XferHandle xfer = 0;
  const std::vector<std::int64_t> local{3};
  const std::vector<std::int64_t> remote{5};
  ASSERT_EQ(a.engine->post_write(peer, 1, local, remote, &xfer), Status::kSuccess);
  EXPECT_EQ(progress_until_ended(a, b, xfer), Status::kSuccess);
  EXPECT_TRUE(bytes_equal(a.pool.block(3), b.pool.block(5), kBlockLen));
  EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
}

TEST(UcxScatterTest, WithoutRmaEveryWriteIsScatterEvenLongRuns) {
  // No RDMA device here: no RMA, no rkey published, and a write of one long
  // run (the whole pool) goes as scatter messages of a chunk each.
  Agent a("scatter-a", {}, 1);
  Agent b("scatter-b", {}, 2);
  ASSERT_FALSE(a.engine->counters().empty());
  std::vector<std::int64_t> all(kBlocks);
  for (std::uint64_t i = 0; i < kBlocks; ++i) all[i] = static_cast<std::int64_t>(i);
  write_and_verify(a, b, all, all);
  EXPECT_EQ(a.counter("put_writes"), 0u);
  EXPECT_EQ(a.counter("scatter_writes"), 1u);
  // 1 MiB in chunks of just under 1 MiB (ucx_config.h).
  EXPECT_EQ(a.counter("scatter_messages"), 2u);
  ucx::Blob blob;
  const auto bytes = b.engine->local_blob();
  ASSERT_TRUE(ucx::decode_blob(bytes, &blob));
  EXPECT_TRUE(blob.rkey.empty()) << "an rkey was published without RMA";
}

TEST(UcxScatterTest, LongRunsAndScatterOffGoAsPutsWithRmaOn) {
  // Puts over TCP only where a user asks for RMA (KVXFER_RMA=on), both sides.
  Agent off("scatter-off", {{"KVXFER_SCATTER_MAX_RUN", "0"}, {"KVXFER_RMA", "on"}}, 1);
  Agent b("scatter-b", {{"KVXFER_RMA", "on"}}, 2);
  write_and_verify(off, b, shuffled(3), shuffled(4));
  EXPECT_EQ(off.counter("put_writes"), 1u);
  EXPECT_EQ(off.counter("scatter_writes"), 0u);
  // Runs averaging more than the threshold (64 KiB by default) are puts too.
  Agent a("scatter-a", {{"KVXFER_RMA", "on"}}, 1);
  write_and_verify(a, b, {0, 1, 2, 3, 4, 5, 6, 7, 20, 21, 22, 23, 24, 25, 26, 27},
                   {8, 9, 10, 11, 12, 13, 14, 15, 50, 51, 52, 53, 54, 55, 56, 57});
  EXPECT_EQ(a.counter("put_writes"), 1u);
  EXPECT_EQ(a.counter("scatter_writes"), 0u);
  EXPECT_EQ(b.counter("scatter_received"), 0u);
}

TEST(UcxScatterTest, DisconnectEndsEveryScatterWriteStillAwaitingAcks) {
  Agent a("scatter-a", {{"KVXFER_SCATTER_CHUNK", "4K"}}, 1);
  Agent b("scatter-b", {}, 2);
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &peer), Status::kSuccess);
  std::vector<XferHandle> xfers;
  for (int w = 0; w < 16; ++w) {
    XferHandle xfer = 0;
    ASSERT_EQ(a.engine->post_write(peer, static_cast<TransferId>(w + 1), shuffled(10 + w),
                                   shuffled(100 + w), &xfer),
              Status::kSuccess);
    xfers.push_back(xfer);
  }
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  for (const XferHandle xfer : xfers) {
    Status state = Status::kInProgress;
    EXPECT_EQ(a.engine->check(xfer, &state), Status::kSuccess);
    EXPECT_TRUE(state == Status::kSuccess || state == Status::kCanceled) << status_name(state);
    EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  }
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

// With posts inline, a caller that polls takes the worker over from the
// progress thread; once it stops polling, the thread must take it back, or
// writes would hang. (Handed off, the caller never drives the worker:
// PostsAreHandedToTheProgressThreadUnlessInline.)
TEST(UcxScatterTest, ProgressThreadTakesOverWhenTheCallerStopsPolling) {
  Agent a("scatter-a", {{"KVXFER_SCATTER_CHUNK", "4K"}, {"KVXFER_POST", "inline"}}, 1);
  Agent b("scatter-b", {}, 2);
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &peer), Status::kSuccess);
  for (int round = 0; round < 5; ++round) {
    XferHandle xfer = 0;
    const auto local = shuffled(200 + round);
    const auto remote = shuffled(300 + round);
    ASSERT_EQ(a.engine->post_write(peer, static_cast<TransferId>(round + 1), local, remote, &xfer),
              Status::kSuccess);
    a.engine->progress();  // one poll, then the caller goes away
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    Status state = Status::kInProgress;
    while (state == Status::kInProgress && std::chrono::steady_clock::now() < deadline) {
      ASSERT_EQ(a.engine->check(xfer, &state), Status::kSuccess);  // check() does not progress
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(state, Status::kSuccess) << "round " << round;
    for (std::size_t i = 0; i < local.size(); ++i) {
      EXPECT_TRUE(bytes_equal(a.pool.block(static_cast<std::uint64_t>(local[i])),
                              b.pool.block(static_cast<std::uint64_t>(remote[i])), kBlockLen))
          << round << ' ' << i;
    }
    EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  }
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
}

TEST(UcxScatterTest, BadKnobsAreRefusedByName) {
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"KVXFER_SCATTER_MAX_RUN", "lots"},
                                                        {"KVXFER_SCATTER_MAX_RUN", "64Q"},
                                                        {"KVXFER_SCATTER_CHUNK", "1"},
                                                        {"KVXFER_SCATTER_CHUNK", "1G"}}) {
    try {
      Agent bad("scatter-bad", {{key, value}}, 1);
      ADD_FAILURE() << key << "=" << value << " was taken";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

// A bare UCX worker that speaks the scatter protocol by hand, as a broken or
// hostile initiator could.
class RawClient {
 public:
  explicit RawClient(const std::vector<std::uint8_t>& target_blob) {
    if (!ucx::decode_blob(target_blob, &blob_)) throw std::runtime_error("bad blob");
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "config_read");
    check(ucp_config_modify(config, "TLS", "tcp"), "config_modify");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    const ucs_status_t st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    check(st, "init");
    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(context_, &wparams, &worker_), "worker_create");
    ucp_am_handler_param_t h{};
    h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG;
    h.id = ucx::kScatterAckAmId;
    h.cb = &RawClient::on_ack;
    h.arg = this;
    check(ucp_worker_set_am_recv_handler(worker_, &h), "set_am_recv_handler");
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(blob_.worker_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    check(ucp_ep_create(worker_, &ep, &ep_), "ep_create");
  }
  ~RawClient() {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep_, &p);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      while (ucp_request_check_status(req) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(req);
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  [[nodiscard]] std::uint64_t token() const { return blob_.cookie_epoch; }

  // Sends a fence (wire/fence.h) and drives the send to its end.
  void fence(std::uint64_t lineage, std::uint64_t gen, std::uint64_t epoch,
             std::optional<std::uint64_t> token = std::nullopt) {
    std::vector<std::uint8_t> bytes(ucx::kFenceLen);
    ucx::encode_fence(bytes.data(), ucx::Fence{token.value_or(this->token()), lineage, gen, epoch});
    send_only(ucx::kFenceAmId, bytes, {}, 0);
  }

  // Sends one message and drives the send to its end.
  void send_only(unsigned id, const std::vector<std::uint8_t>& header,
                 const std::vector<std::uint8_t>& payload, std::uint32_t flags) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = flags | UCP_AM_SEND_FLAG_EAGER;
    void* req = ucp_am_send_nbx(ep_, id, header.data(), header.size(),
                                payload.empty() ? nullptr : payload.data(), payload.size(), &p);
    if (UCS_PTR_IS_ERR(req)) throw std::runtime_error("am_send failed");
    if (req != nullptr) {
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      while (ucp_request_check_status(req) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(req);
    }
  }

  // Sends one message: `header` as is, `payload` as its data. Returns the
  // target's ack, or nothing within `wait`.
  std::optional<ucx::ScatterAck> send(const std::vector<std::uint8_t>& header,
                                      const std::vector<std::uint8_t>& payload,
                                      std::uint64_t sequence,
                                      std::chrono::milliseconds wait = 10s) {
    send_only(ucx::kScatterAmId, header, payload, UCP_AM_SEND_FLAG_REPLY);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_);
      for (const ucx::ScatterAck& ack : acks_) {
        if (ack.sequence == sequence) return ack;
      }
    }
    return std::nullopt;
  }

 private:
  static void check(ucs_status_t st, const char* what) {
    if (st != UCS_OK) throw std::runtime_error(std::string("ucp ") + what + " failed");
  }
  static ucs_status_t on_ack(void* arg, const void* header, std::size_t header_length, void*,
                             std::size_t, const ucp_am_recv_param_t*) {
    ucx::ScatterAck ack;
    if (ucx::decode_ack({static_cast<const std::uint8_t*>(header), header_length}, &ack)) {
      static_cast<RawClient*>(arg)->acks_.push_back(ack);
    }
    return UCS_OK;
  }

  ucx::Blob blob_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  std::vector<ucx::ScatterAck> acks_;
};

constexpr std::uint64_t kLineage = 0x1111222233334444ull;
constexpr std::uint64_t kEpoch = 0x5555666677778888ull;

std::vector<std::uint8_t> header_of(std::uint64_t token, std::uint64_t sequence,
                                    const std::vector<ucx::ScatterRun>& runs,
                                    std::uint64_t lineage = kLineage,
                                    std::uint64_t epoch = kEpoch) {
  std::vector<std::uint8_t> h(ucx::scatter_header_len(runs.size()));
  ucx::put_scatter_fixed(h.data(), static_cast<std::uint16_t>(runs.size()), token, sequence, 7,
                         lineage, epoch);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    ucx::put_scatter_run(h.data(), i, runs[i].offset, runs[i].length);
  }
  return h;
}

TEST(UcxScatterTest, TargetRefusesWhatDoesNotFitAndWritesNothing) {
  Agent target("scatter-target", {}, 2);
  RawClient client(target.engine->local_blob());
  client.fence(kLineage, 1, kEpoch);
  const std::uint64_t region = kBlocks * kBlockLen;
  const std::vector<std::uint8_t> page(4096, 0xAB);
  struct Case {
    const char* what;
    std::uint64_t token;
    std::vector<ucx::ScatterRun> runs;
    ucs_status_t expect;
  };
  const std::vector<Case> cases = {
      {"run past the region's end", client.token(), {{region - 2048, 4096}}, UCS_ERR_INVALID_PARAM},
      {"offset whose end wraps",
       client.token(),
       {{~std::uint64_t{0} - 100, 4096}},
       UCS_ERR_INVALID_PARAM},
      {"runs longer than the payload",
       client.token(),
       {{0, 4096}, {8192, 4096}},
       UCS_ERR_INVALID_PARAM},
      {"runs shorter than the payload", client.token(), {{0, 2048}}, UCS_ERR_INVALID_PARAM},
      {"another engine's token", client.token() ^ 1, {{0, 4096}}, UCS_ERR_REJECTED},
  };
  std::uint64_t sequence = 100;
  for (const Case& c : cases) {
    ++sequence;
    const auto ack = client.send(header_of(c.token, sequence, c.runs), page, sequence);
    ASSERT_TRUE(ack.has_value()) << c.what;
    EXPECT_EQ(ack->status, static_cast<std::int32_t>(c.expect)) << c.what;
    EXPECT_EQ(ack->slot, 7u) << c.what;
  }
  // Malformed headers are dropped without an ack.
  ++sequence;
  std::vector<std::uint8_t> bad_magic = header_of(client.token(), sequence, {{0, 4096}});
  bad_magic[0] ^= 0xff;
  EXPECT_FALSE(client.send(bad_magic, page, sequence, 300ms).has_value());
  EXPECT_TRUE(untouched(target, 2));
  EXPECT_EQ(target.counter("scatter_rejected"), cases.size() + 1);

  // The same client's well-formed message lands: the refusals above were
  // the handler's checks, not a client that cannot write.
  ++sequence;
  const auto ok =
      client.send(header_of(client.token(), sequence, {{kBlockLen, 4096}}), page, sequence);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 0);
  EXPECT_TRUE(bytes_equal(target.pool.block(1), page.data(), page.size()));
  EXPECT_EQ(target.counter("scatter_received"), cases.size() + 2);
}

}  // namespace
}  // namespace kvxfer::it
