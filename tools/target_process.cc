// SPDX-License-Identifier: Apache-2.0
#include "target_process.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <iostream>
#include <map>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bench_config.h"
#include "kvxfer/transport.h"
#include "notify_probe.h"
#include "pattern.h"
#include "pool.h"
#include "pretouch_wait.h"
#include "raw_stream.h"
#include "subprocess.h"
#include "timing.h"

namespace kvxfer::tools {
namespace {

// HELLO to OPEN, on a fresh connection: a peer that says nothing is dropped.
constexpr Millis kHandshakeTimeout{10'000};
// READY (UCX start-up and touching a 1 GiB pool) and VERIFIED (checking up to
// a few hundred MiB) come well within this.
constexpr Millis kReplyTimeout{120'000};
// Between commands, while the initiator measures. A spawned target also ends
// when its parent does (EOF), so only a remote one relies on this.
constexpr Millis kIdleTimeout{60 * 60 * 1000};
constexpr Millis kWriteTimeout{30'000};
// Longest "<remote> <local>" line of a VERIFY list.
constexpr std::size_t kMaxPairLine = 64;
// Most notifications one NOTES may wait for, and for how long.
constexpr std::uint64_t kMaxNotes = 1'000'000;
constexpr auto kNotesTimeout = std::chrono::seconds(60);
// Most bytes one STREAM may ask a target to receive.
constexpr std::uint64_t kMaxStreamBytes = std::uint64_t{64} << 30;

std::string_view version_number() {
  std::string_view v = kvxfer::version();  // "kvxfer X.Y.Z"
  if (const auto space = v.rfind(' '); space != std::string_view::npos) v.remove_prefix(space + 1);
  return v;
}

bool parse_i64(std::string_view text, std::int64_t* out) {
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc{} && ptr == text.data() + text.size();
}

// One initiator's session with this target.
class TargetSession {
 public:
  TargetSession(LineChannel& channel, const TargetConfig& config, std::unique_ptr<Pool>& pool)
      : channel_(channel),
        config_(config),
        fingerprint_(config_fingerprint(bench_config_fields(config.tls))),
        pool_(pool) {}

  // Returns 0 after QUIT or EOF; throws ChannelError on a broken session.
  int serve() {
    channel_.write_line(
        fmt::format("HELLO kvxfer-target protocol={} version={}", kBenchProtocol, version_number()),
        kWriteTimeout);
    Millis timeout = kHandshakeTimeout;
    for (;;) {
      const std::string line = channel_.read_line(timeout);
      timeout = kIdleTimeout;
      const Message m = Message::parse(line);
      if (m.word == "QUIT") return 0;
      if (m.word == "OPEN") {
        open(m);
      } else if (m.word == "VERIFY") {
        verify(m);
      } else if (m.word == "CLOSE") {
        transport_.reset();
      } else if (m.word == "STREAM") {
        stream(m);
      } else if (m.word == "FILL") {
        fill(m);
      } else if (m.word == "NOTES") {
        notes(m);
      } else {
        const std::string word = m.word.substr(0, 32);
        channel_.write_line("ERROR unknown command '" + word + "'", kWriteTimeout);
        throw ChannelError(
            fmt::format("{} sent an unknown command '{}'", channel_.peer_name(), word));
      }
    }
  }

 private:
  void refuse(const std::string& why) {
    std::cerr << "kvxfer target: refused " << channel_.peer_name() << ": " << why << '\n';
    channel_.write_line("REFUSED " + why, kWriteTimeout);
  }

  void open(const Message& m) {
    transport_.reset();
    num_blocks_ = 0;  // nothing to verify until this open succeeds
    const std::uint64_t block_len = m.number("block_len");
    const std::uint64_t region = m.number("region");
    const std::string& fingerprint = m.text("fingerprint");
    if (fingerprint != fingerprint_) {
      refuse(fmt::format(
          "config fingerprint {} differs from this target's {}: both ends must run the same bench "
          "protocol ({}), block pattern ({}) and transports (this target runs --tls '{}')",
          fingerprint.substr(0, 32), fingerprint_, kBenchProtocol, kPatternName, config_.tls));
      return;
    }
    if (block_len == 0) {
      refuse("block length 0: a block must hold at least one byte");
      return;
    }
    if (config_.block_len != 0 && block_len != config_.block_len) {
      refuse(fmt::format(
          "block length {} differs from this target's {} (run the initiator with --block-len {}, "
          "or start the target without --block-len)",
          block_len, config_.block_len, config_.block_len));
      return;
    }
    if (region < block_len || region > config_.max_region) {
      refuse(
          fmt::format("a region of {} bytes for blocks of {} is outside what this target serves "
                      "(one block up to --region {} bytes)",
                      region, block_len, config_.max_region));
      return;
    }
    try {
      if (pool_ == nullptr || pool_->size() != region) {
        pool_.reset();
        pool_ = std::make_unique<Pool>(region);
      }
      Options options = bench_options(config_.tls);
      for (const auto& [key, value] : config_.engine) options.engine_config[key] = value;
      transport_ = std::make_unique<Transport>(
          fmt::format("bench-target-{}-{}", ::getpid(), ++opens_),
          Region{pool_->data(), region / block_len, block_len}, options);
      num_blocks_ = region / block_len;
      block_len_ = block_len;
      // Ready once the registration's pre-touch of the pool is done, as a
      // server's pool is by the time its first transfers come (the
      // initiator times open() and reports it).
      // At most half the initiator's reply timeout (kReplyTimeout).
      static_cast<void>(wait_for_pretouch(*transport_, std::chrono::seconds(60)));
    } catch (const std::exception& e) {
      refuse(fmt::format("cannot register a pool of {} bytes: {}", region, e.what()));
      return;
    }
    channel_.write_line(
        fmt::format("READY metadata={} base={} num_blocks={} block_len={} fingerprint={}",
                    to_hex(transport_->agent_metadata()), transport_->base_addr(),
                    transport_->num_blocks(), transport_->block_len(),
                    transport_->config_fingerprint()),
        kWriteTimeout);
  }

  // The pool of the opened region, patterned for an initiator to read.
  void fill(const Message& m) {
    const std::uint64_t seed = m.number("seed");
    if (transport_ == nullptr || num_blocks_ == 0) {
      channel_.write_line("ERROR FILL needs an opened region", kWriteTimeout);
      throw ChannelError(fmt::format("{} asked for FILL without a region", channel_.peer_name()));
    }
    for (std::uint64_t i = 0; i < num_blocks_; ++i) {
      fill_block(pool_->data() + i * block_len_, block_len_, seed, i);
    }
    channel_.write_line(fmt::format("FILLED blocks={}", num_blocks_), kWriteTimeout);
  }

  // NOTES count=N seed=S: takes notifications (bench --op notify) until N
  // came or kNotesTimeout passed, and answers how long each took from its
  // post to here, whether the block it names already held its bytes (the
  // pattern of its local block for S), and whether each sender's came in
  // order.
  void notes(const Message& m) {
    const std::uint64_t count = m.number("count");
    const std::uint64_t seed = m.number("seed");
    if (transport_ == nullptr || num_blocks_ == 0 || count == 0 || count > kMaxNotes) {
      channel_.write_line(
          fmt::format("ERROR NOTES of {} needs an opened region and at most {}", count, kMaxNotes),
          kWriteTimeout);
      throw ChannelError(fmt::format("{} asked for bad NOTES", channel_.peer_name()));
    }
    channel_.write_line("NOTING", kWriteTimeout);
    std::vector<double> latency_us;
    latency_us.reserve(count);
    std::uint64_t bad = 0;
    std::uint64_t out_of_order = 0;
    std::map<std::string, std::uint64_t> next_seq;
    const auto deadline = std::chrono::steady_clock::now() + kNotesTimeout;
    while (latency_us.size() < count && std::chrono::steady_clock::now() < deadline) {
      const auto taken = transport_->get_notifications();
      const std::uint64_t now = monotonic_ns();
      if (taken.empty()) {
        std::this_thread::yield();  // a serving loop would do other work here
        continue;
      }
      for (const auto& [sender, messages] : taken) {
        for (const auto& bytes : messages) {
          const auto probe = NotifyProbe::decode(bytes);
          if (!probe) {
            ++bad;
            latency_us.push_back(0);
            continue;
          }
          latency_us.push_back(static_cast<double>(now - probe->posted_ns) / 1000.0);
          std::uint64_t& next = next_seq[sender];
          if (probe->seq != next) ++out_of_order;
          next = probe->seq + 1;
          if (probe->remote >= 0) {
            const auto r = static_cast<std::uint64_t>(probe->remote);
            if (r >= num_blocks_ || probe->local < 0 ||
                !block_matches(pool_->data() + r * block_len_, block_len_, seed,
                               static_cast<std::uint64_t>(probe->local))) {
              ++bad;
            }
          }
        }
      }
    }
    const Timing t = Timing::of(latency_us);
    channel_.write_line(
        fmt::format("NOTED got={} bad={} out_of_order={} p50_ns={} p99_ns={} max_ns={} mean_ns={}",
                    t.count, bad, out_of_order, static_cast<std::uint64_t>(t.p50_us * 1000),
                    static_cast<std::uint64_t>(t.p99_us * 1000),
                    static_cast<std::uint64_t>(t.max_us * 1000),
                    static_cast<std::uint64_t>(t.mean_us * 1000)),
        kWriteTimeout);
  }

  // The raw TCP baseline: one connection, `bytes` received into the pool.
  void stream(const Message& m) {
    const std::uint64_t bytes = m.number("bytes");
    if (pool_ == nullptr || bytes == 0 || bytes > kMaxStreamBytes) {
      channel_.write_line(
          fmt::format("ERROR STREAM of {} bytes: needs an opened region and at most {}", bytes,
                      kMaxStreamBytes),
          kWriteTimeout);
      throw ChannelError(fmt::format("{} asked for a bad STREAM", channel_.peer_name()));
    }
    std::uint16_t port = 0;
    const int fd = listen_for_stream(local_address_of(channel_.read_fd()), &port);
    channel_.write_line(fmt::format("STREAMING port={}", port), kWriteTimeout);
    receive_stream(fd, pool_->data(), pool_->size(), bytes);
    channel_.write_line(fmt::format("STREAMED bytes={}", bytes), kWriteTimeout);
  }

  // A verify ends the region's writes: the transport is closed first, so no
  // byte can land while it is checked, and joining the engine's threads
  // orders every byte they copied before the reads below.
  void verify(const Message& m) {
    transport_.reset();
    const std::uint64_t seed = m.number("seed");
    const std::uint64_t count = m.number("count");
    if (count > kMaxVerifyPairs) {
      channel_.write_line(
          fmt::format("ERROR VERIFY of {} blocks is over the limit of {}", count, kMaxVerifyPairs),
          kWriteTimeout);
      throw ChannelError(fmt::format("{} asked to verify {} blocks", channel_.peer_name(), count));
    }
    std::uint64_t good = 0;
    std::uint64_t bad = 0;
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::string line = channel_.read_line(kReplyTimeout, kMaxPairLine);
      const auto space = line.find(' ');
      std::int64_t remote = -1;
      std::int64_t local = -1;
      if (space == std::string::npos ||
          !parse_i64(std::string_view(line).substr(0, space), &remote) ||
          !parse_i64(std::string_view(line).substr(space + 1), &local)) {
        throw ChannelError(fmt::format("{} sent a bad VERIFY line", channel_.peer_name()));
      }
      const bool in_range = pool_ != nullptr && remote >= 0 && local >= 0 &&
                            static_cast<std::uint64_t>(remote) < num_blocks_;
      const std::uint64_t len = in_range ? block_len_ : 0;
      if (in_range && block_matches(pool_->data() + static_cast<std::uint64_t>(remote) * len, len,
                                    seed, static_cast<std::uint64_t>(local))) {
        ++good;
      } else {
        ++bad;
      }
    }
    channel_.write_line(fmt::format("VERIFIED good={} bad={}", good, bad), kWriteTimeout);
  }

  LineChannel& channel_;
  const TargetConfig& config_;
  const std::string fingerprint_;
  std::unique_ptr<Pool>& pool_;  // kept across sessions: touching 1 GiB costs ~0.3 s
  std::unique_ptr<Transport> transport_;
  std::uint64_t num_blocks_ = 0;  // of the last region opened; kept for VERIFY
  std::uint64_t block_len_ = 0;
  int opens_ = 0;
};

}  // namespace

std::vector<std::string> target_command(const std::string& tls, std::uint64_t region,
                                        const std::map<std::string, std::string>& engine) {
  std::vector<std::string> args = {"target", "--tls", tls, "--region", std::to_string(region)};
  for (const auto& [key, value] : engine) {
    args.push_back("--engine");
    args.push_back(key + "=" + value);
  }
  return args;
}

// --- the initiator's end ---------------------------------------------------

TargetProcess::TargetProcess(std::unique_ptr<Subprocess> child,
                             std::unique_ptr<LineChannel> channel)
    : child_(std::move(child)), channel_(std::move(channel)) {}

TargetProcess::~TargetProcess() = default;  // a child still running is killed

std::unique_ptr<TargetProcess> TargetProcess::spawn(const std::vector<std::string>& args) {
  SpawnOptions options;
  options.argv = {"/proc/self/exe"};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.pipe_stdin = true;
  options.pipe_stdout = true;
  auto child = std::make_unique<Subprocess>(options);
  const int to = child->take_stdin();
  const int from = child->take_stdout();
  auto channel =
      std::make_unique<LineChannel>(from, to, fmt::format("target (pid {})", child->pid()));
  std::unique_ptr<TargetProcess> target(new TargetProcess(std::move(child), std::move(channel)));
  target->read_hello();
  return target;
}

std::unique_ptr<TargetProcess> TargetProcess::connect(const HostPort& where) {
  const int fd = tcp_connect(where, kHandshakeTimeout);
  auto channel = std::make_unique<LineChannel>(fd, fd, "target at " + where.str());
  std::unique_ptr<TargetProcess> target(new TargetProcess(nullptr, std::move(channel)));
  target->read_hello();
  return target;
}

void TargetProcess::read_hello() {
  const Message m = Message::parse(channel_->read_line(kReplyTimeout));
  if (m.word != "HELLO" || m.rest.rfind("kvxfer-target ", 0) != 0) {
    throw ChannelError(
        fmt::format("{} is not a kvxfer target (it said '{}')", name(), m.word.substr(0, 32)));
  }
  if (m.text("protocol") != kBenchProtocol) {
    throw TargetRefused(
        fmt::format("{} speaks bench protocol {}, we speak {}: run the same "
                    "kvxfer version on both ends",
                    name(), m.text("protocol").substr(0, 16), kBenchProtocol));
  }
  version_ = m.text("version").substr(0, 32);
}

const TargetGeometry& TargetProcess::open(std::uint64_t block_len, std::uint64_t region_bytes,
                                          const std::string& fingerprint) {
  channel_->write_line(fmt::format("OPEN block_len={} region={} fingerprint={}", block_len,
                                   region_bytes, fingerprint),
                       kWriteTimeout);
  TargetGeometry g = parse_ready(channel_->read_line(kReplyTimeout), name());
  // Refuse on our side too: a target that answers with another geometry or
  // config than we asked for would make every figure meaningless.
  if (g.block_len != block_len || g.num_blocks != region_bytes / block_len) {
    throw TargetRefused(fmt::format("{} opened {} blocks of {} bytes, we asked for {} of {}",
                                    name(), g.num_blocks, g.block_len, region_bytes / block_len,
                                    block_len));
  }
  if (g.fingerprint != fingerprint) {
    throw TargetRefused(fmt::format("{} runs config fingerprint {}, ours is {}", name(),
                                    g.fingerprint, fingerprint));
  }
  geometry_ = std::move(g);
  return geometry_;
}

std::pair<std::uint64_t, std::uint64_t> TargetProcess::verify(
    std::uint64_t seed, const std::vector<std::pair<std::int64_t, std::int64_t>>& pairs) {
  std::string out = fmt::format("VERIFY seed={} count={}\n", seed, pairs.size());
  for (const auto& [r, l] : pairs) fmt::format_to(std::back_inserter(out), "{} {}\n", r, l);
  channel_->write_raw(out, kReplyTimeout);
  const std::string line = channel_->read_line(kReplyTimeout);
  const Message m = Message::parse(line);
  if (m.word != "VERIFIED") {
    throw ChannelError(fmt::format("{}: bad verify reply '{}'", name(), line.substr(0, 200)));
  }
  return {m.number("good"), m.number("bad")};
}

double TargetProcess::raw_stream(const std::string& host, const std::uint8_t* src,
                                 std::uint64_t src_len, std::uint64_t bytes) {
  channel_->write_line(fmt::format("STREAM bytes={}", bytes), kWriteTimeout);
  const std::string line = channel_->read_line(kReplyTimeout);
  const Message m = Message::parse(line);
  if (m.word != "STREAMING") {
    throw ChannelError(fmt::format("{}: bad stream reply '{}'", name(), line.substr(0, 200)));
  }
  const auto port = m.number("port");
  if (port == 0 || port > 65535) throw ChannelError(name() + ": bad stream port");
  const auto start = std::chrono::steady_clock::now();
  send_stream(HostPort{host, static_cast<std::uint16_t>(port)}, src, src_len, bytes,
              std::uint64_t{1} << 20);
  const Message done = Message::parse(channel_->read_line(kReplyTimeout));
  if (done.word != "STREAMED" || done.number("bytes") != bytes) {
    throw ChannelError(name() + ": the stream did not complete");
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void TargetProcess::fill(std::uint64_t seed) {
  channel_->write_line(fmt::format("FILL seed={}", seed), kWriteTimeout);
  const std::string line = channel_->read_line(kReplyTimeout);
  const Message m = Message::parse(line);
  if (m.word != "FILLED" || m.number("blocks") != geometry_.num_blocks) {
    throw ChannelError(fmt::format("{}: bad fill reply '{}'", name(), line.substr(0, 200)));
  }
}

void TargetProcess::notes_begin(std::uint64_t count, std::uint64_t seed) {
  channel_->write_line(fmt::format("NOTES count={} seed={}", count, seed), kWriteTimeout);
  const std::string line = channel_->read_line(kReplyTimeout);
  if (line != "NOTING") {
    throw ChannelError(fmt::format("{}: bad notes reply '{}'", name(), line.substr(0, 200)));
  }
}

TargetProcess::NotesTaken TargetProcess::notes_taken() {
  // The target gives up after kNotesTimeout on its own.
  const std::string line = channel_->read_line(kReplyTimeout);
  const Message m = Message::parse(line);
  if (m.word != "NOTED") {
    throw ChannelError(fmt::format("{}: bad notes reply '{}'", name(), line.substr(0, 200)));
  }
  const auto us = [&](const char* key) { return static_cast<double>(m.number(key)) / 1000.0; };
  return {m.number("got"), m.number("bad"), m.number("out_of_order"), us("p50_ns"), us("p99_ns"),
          us("max_ns"),    us("mean_ns")};
}

pid_t TargetProcess::pid() const { return child_ != nullptr ? child_->pid() : 0; }

void TargetProcess::close_region() { channel_->write_line("CLOSE", kWriteTimeout); }

int TargetProcess::quit() {
  try {
    channel_->write_line("QUIT", kWriteTimeout);
  } catch (const ChannelError&) {
    // Already gone: its exit status says how.
  }
  if (child_ == nullptr) return 0;
  if (const auto status = child_->wait_for(Millis(30'000))) return *status;
  child_->kill();
  return child_->wait();
}

// --- the target's end -------------------------------------------------------

int run_target(const TargetConfig& config) {
  std::unique_ptr<Pool> pool;
  LineChannel channel(::dup(STDIN_FILENO), ::dup(STDOUT_FILENO), "initiator (parent)");
  // The channel has its own copy of stdout; everything else this process
  // prints there (UCX logs to stdout by default, e.g. an ERROR line when an
  // initiator drops a TCP connection) now goes to stderr, never into the
  // protocol.
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
  TargetSession session(channel, config, pool);
  try {
    return session.serve();
  } catch (const ChannelError& e) {
    std::cerr << "kvxfer target: " << e.what() << '\n';
    return 2;
  }
}

int run_target_listener(const HostPort& where, const TargetConfig& config, int sessions) {
  TcpListener listener(where);
  HostPort bound = where;
  bound.port = listener.bound_port();
  std::cout << "kvxfer bench target: listening on " << bound.str() << std::endl;
  std::unique_ptr<Pool> pool;
  for (int served = 0; sessions == 0 || served < sessions; ++served) {
    std::string peer;
    const int fd = listener.accept_one(&peer);
    LineChannel channel(fd, fd, peer);
    TargetSession session(channel, config, pool);
    try {
      session.serve();
      std::cerr << "kvxfer bench target: session with " << peer << " ended\n";
    } catch (const std::exception& e) {
      std::cerr << "kvxfer bench target: session with " << peer << " dropped: " << e.what() << '\n';
    }
  }
  return 0;
}

}  // namespace kvxfer::tools
