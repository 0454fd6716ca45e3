// SPDX-License-Identifier: Apache-2.0
// The tcp lane when its process runs out of file descriptors (issue 46,
// item 5): a token-less client opens connections until RLIMIT_NOFILE is
// reached. The target's I/O thread must not spin on a listener that stays
// readable while accept() fails with EMFILE, our own connect must name the
// true cause, and once descriptors are free again a registered peer gets
// in. And the limits the lane sizes from RLIMIT_NOFILE.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engines/tcp/tcp_lane.h"
#include "it_pool.h"
#include "kvxfer/transport.h"
#include "wire/metadata.h"
#include "wire/peer_blob.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using internal::tcp::TcpLane;

constexpr std::uint64_t kBlocks = 16;
constexpr std::uint64_t kBlockLen = 4096;

Options tcp_options() {
  Options options;
  options.engine_config = {{"KVXFER_LANES", "tcp"}};
  return options;
}

std::uint16_t tcp_port_of(const Transport& t) {
  const wire::AgentMetadata m = wire::decode(t.agent_metadata());
  wire::PeerBlob blob;
  if (!wire::decode_blob(m.engine_blob, &blob)) throw std::runtime_error("bad blob");
  return blob.tcp_port;
}

std::size_t open_descriptors() {
  std::size_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// The stat files of the threads named `name`, opened now: read later with
// pread, so reading them needs no descriptor of its own.
std::vector<int> thread_stats(const std::string& name) {
  std::vector<int> fds;
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(task + "/comm");
    std::string c;
    std::getline(comm, c);
    if (c == name) fds.push_back(open((task + "/stat").c_str(), O_RDONLY | O_CLOEXEC));
  }
  closedir(d);
  return fds;
}

// CPU seconds (utime + stime) the threads whose stat files are `fds` used.
double cpu_s(const std::vector<int>& fds) {
  double total = 0;
  for (const int fd : fds) {
    char buf[1024] = {};
    const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) continue;
    const std::string line(buf, static_cast<std::size_t>(n));
    std::istringstream fields(line.substr(line.rfind(')') + 2));
    std::string f;
    std::uint64_t utime = 0;
    std::uint64_t stime = 0;
    for (int i = 3; i <= 15 && fields >> f; ++i) {
      if (i == 14) utime = std::stoull(f);
      if (i == 15) stime = std::stoull(f);
    }
    total += static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  return total;
}

// Lowers this process's RLIMIT_NOFILE for the scope and closes what it
// opened under it.
class LowLimit {
 public:
  explicit LowLimit(rlim_t soft) {
    getrlimit(RLIMIT_NOFILE, &old_);
    rlimit low = old_;
    low.rlim_cur = soft;
    setrlimit(RLIMIT_NOFILE, &low);
  }
  ~LowLimit() {
    for (const int fd : held) close(fd);
    setrlimit(RLIMIT_NOFILE, &old_);
  }
  LowLimit(const LowLimit&) = delete;
  LowLimit& operator=(const LowLimit&) = delete;
  std::vector<int> held;

 private:
  rlimit old_{};
};

TEST(TcpLimitsTest, TheLaneTakesAtMostHalfOfTheDescriptorLimit) {
  const auto l1024 = TcpLane::conn_limits(1024);
  EXPECT_EQ(l1024.total, 512u);
  EXPECT_EQ(l1024.unregistered, 256u);
  EXPECT_EQ(l1024.pending, 128u);
  EXPECT_EQ(l1024.closing, 64u);
  EXPECT_EQ(l1024.per_key, TcpLane::kMaxConnectionsPerKey);
  EXPECT_EQ(TcpLane::conn_limits(256).per_key, 16u);
  // Room is always left for registered peers' hellos.
  EXPECT_LT(l1024.unregistered + l1024.pending + l1024.closing, l1024.total);
  const auto big = TcpLane::conn_limits(1'048'576);
  EXPECT_EQ(big.total, TcpLane::kMaxConnections);
  EXPECT_EQ(big.unregistered, TcpLane::kMaxUnregisteredConnections);
  EXPECT_EQ(big.pending, TcpLane::kMaxPendingHellos);
  EXPECT_LT(big.unregistered + big.pending + big.closing, big.total);
  const auto tiny = TcpLane::conn_limits(8);
  EXPECT_GE(tiny.total, 16u);
  EXPECT_GE(tiny.pending, 2u);
  // One key holds at least one registration's connections, and never all.
  EXPECT_EQ(tiny.per_key, TcpLane::kMaxConnectionsPerLineage);
  EXPECT_LT(tiny.per_key, tiny.total);
}

TEST(TcpLimitsTest, OutOfDescriptorsTheListenerRestsAndEveryoneSaysWhy) {
  MappedPool target_pool(kBlocks, kBlockLen, 0);
  Transport target("target", Region{target_pool.base(), kBlocks, kBlockLen}, tcp_options());
  MappedPool peer_pool(kBlocks, kBlockLen, 0);
  Transport peer("peer", Region{peer_pool.base(), kBlocks, kBlockLen}, tcp_options());
  const std::uint16_t port = tcp_port_of(target);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // The target's I/O thread and the peer's (each names itself once it runs).
  std::vector<int> io_threads;
  for (int i = 0; i < 200 && io_threads.size() < 2; ++i) {
    for (const int fd : io_threads) close(fd);
    std::this_thread::sleep_for(10ms);
    io_threads = thread_stats("kvxfer-tcp");
  }
  ASSERT_EQ(io_threads.size(), 2u);
  {
    LowLimit limit(open_descriptors() + 64);
    // Connections that never say hello, until no descriptor is left: the
    // last ones wait in the target's accept queue, which stays readable.
    for (int i = 0; i < 1000; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      limit.held.push_back(fd);
      if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) break;
    }
    ASSERT_GT(limit.held.size(), 4u);
    std::this_thread::sleep_for(200ms);  // the target meets EMFILE
    const double before = cpu_s(io_threads);
    std::this_thread::sleep_for(1s);
    const double used = cpu_s(io_threads) - before;
    // Spinning on the listener burns the second (0.3 s or more even on a
    // loaded 2-core machine); resting costs a few wakes.
    EXPECT_LT(used, 0.1) << "the I/O threads used " << used << " s of CPU in 1 s";
    EXPECT_GE(target.stats().engine_counters.at("tcp_refused_full"), 1u);
    // Our own registration cannot open a socket: it says so.
    try {
      peer.add_remote_peer("target", target.agent_metadata(),
                           reinterpret_cast<std::uintptr_t>(target_pool.base()), kBlocks,
                           kBlockLen);
      ADD_FAILURE() << "registered without a descriptor to connect with";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("cannot open a socket"), std::string::npos) << what;
      EXPECT_NE(what.find("RLIMIT_NOFILE"), std::string::npos) << what;
    }
  }
  for (const int fd : io_threads) close(fd);
  // Descriptors are back: the target accepts again and a registered peer
  // gets in and writes.
  target.add_remote_peer("peer", peer.agent_metadata(),
                         reinterpret_cast<std::uintptr_t>(peer_pool.base()), kBlocks, kBlockLen);
  peer.add_remote_peer("target", target.agent_metadata(),
                       reinterpret_cast<std::uintptr_t>(target_pool.base()), kBlocks, kBlockLen);
  peer_pool.block(1)[0] = 0x77;
  const std::vector<std::int64_t> local{1};
  const std::vector<std::int64_t> remote{2};
  const auto id = peer.write_blocks("target", local, remote);
  ASSERT_TRUE(id.has_value());
  bool done = false;
  for (int i = 0; i < 5000 && !done; ++i) {
    const PollResult r = peer.poll("target");
    done = std::find(r.done.begin(), r.done.end(), *id) != r.done.end();
    ASSERT_TRUE(r.failed.empty());
    if (!done) std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(done);
  EXPECT_EQ(target_pool.block(2)[0], 0x77);
}

// Issue 46, bytes in flight per peer: transfers of a thousand runs each,
// posted without a poll (so none is released), meet back-pressure once they
// hold TcpLane::kMaxHeldBytesPerPeer of frames and run lists, long before
// kMaxInflightPerPeer transfers: nothing posted, no strike, and once they
// are polled, posts go again.
TEST(TcpLimitsTest, ManyRunTransfersMeetBackPressureByTheBytesTheyHold) {
  constexpr std::uint64_t kSmallBlocks = 2048;
  constexpr std::uint64_t kSmallLen = 64;
  MappedPool target_pool(kSmallBlocks, kSmallLen, 0);
  Transport target("target", Region{target_pool.base(), kSmallBlocks, kSmallLen}, tcp_options());
  MappedPool peer_pool(kSmallBlocks, kSmallLen, 0);
  Transport peer("peer", Region{peer_pool.base(), kSmallBlocks, kSmallLen}, tcp_options());
  target.add_remote_peer("peer", peer.agent_metadata(),
                         reinterpret_cast<std::uintptr_t>(peer_pool.base()), kSmallBlocks,
                         kSmallLen);
  peer.add_remote_peer("target", target.agent_metadata(),
                       reinterpret_cast<std::uintptr_t>(target_pool.base()), kSmallBlocks,
                       kSmallLen);
  // Every other block: a thousand runs nothing merges.
  std::vector<std::int64_t> blocks;
  for (std::int64_t i = 0; i < 1000; ++i) blocks.push_back(2 * i);
  const std::uint64_t fit = TcpLane::kMaxHeldBytesPerPeer / TcpLane::held_by(1000, 0);
  ASSERT_LT(fit, kMaxInflightPerPeer);
  std::vector<TransferId> posted;
  while (posted.size() < 2 * fit) {
    const auto id = peer.write_blocks("target", blocks, blocks);
    if (!id) break;
    posted.push_back(*id);
  }
  EXPECT_EQ(posted.size(), fit);
  const auto refused = peer.stats().peers.at(0);
  EXPECT_EQ(refused.posts_refused, 1u);
  EXPECT_EQ(refused.post_failures, 0u);
  EXPECT_EQ(refused.strikes, 0);
  EXPECT_FALSE(refused.fault.has_value());
  // Once they are polled (done, and released), the peer takes posts again.
  std::size_t done = 0;
  for (int i = 0; i < 10000 && done < posted.size(); ++i) {
    const PollResult r = peer.poll("target");
    done += r.done.size();
    ASSERT_TRUE(r.failed.empty());
    if (done < posted.size()) std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(done, posted.size());
  EXPECT_TRUE(peer.write_blocks("target", blocks, blocks).has_value());
}

// What a transfer held is given back once it is released, its buffers kept
// for the next post or (past what the lane keeps) freed: transfers of
// 32,768 runs (1.3 MB each, freed) one after another, more than the bound
// holds, never meet it.
TEST(TcpLimitsTest, ReleasedTransfersGiveBackWhatTheyHeld) {
  constexpr std::uint64_t kManyBlocks = 65536;
  constexpr std::uint64_t kSmallLen = 64;
  MappedPool target_pool(kManyBlocks, kSmallLen, 0);
  Transport target("target", Region{target_pool.base(), kManyBlocks, kSmallLen}, tcp_options());
  MappedPool peer_pool(kManyBlocks, kSmallLen, 0);
  Transport peer("peer", Region{peer_pool.base(), kManyBlocks, kSmallLen}, tcp_options());
  peer.add_remote_peer("target", target.agent_metadata(),
                       reinterpret_cast<std::uintptr_t>(target_pool.base()), kManyBlocks,
                       kSmallLen);
  std::vector<std::int64_t> blocks;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(kManyBlocks); i += 2) blocks.push_back(i);
  const std::uint64_t rounds =
      TcpLane::kMaxHeldBytesPerPeer / TcpLane::held_by(blocks.size(), 0) + 2;
  for (std::uint64_t round = 0; round < rounds; ++round) {
    const auto id = peer.write_blocks("target", blocks, blocks);
    ASSERT_TRUE(id.has_value()) << "round " << round << " of " << rounds;
    bool done = false;
    for (int i = 0; i < 5000 && !done; ++i) {
      const PollResult r = peer.poll("target");
      ASSERT_TRUE(r.failed.empty());
      done = !r.done.empty();
      if (!done) std::this_thread::sleep_for(1ms);
    }
    ASSERT_TRUE(done);
  }
  EXPECT_EQ(peer.stats().peers.at(0).posts_refused, 0u);
}

}  // namespace
}  // namespace kvxfer::it
