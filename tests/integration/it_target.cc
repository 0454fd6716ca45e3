// SPDX-License-Identifier: Apache-2.0
// kvxfer_it_target: the far side of the multi-process UCX tests.
//
//   kvxfer_it_target --name N --blocks B --block-len L --tls T [--no-progress-thread]
//                    [--poll-loop] [--config KEY=VALUE]... [--guard-bytes G]
//                    [--shared-pool]
//
// --config adds an engine_config entry (e.g. NET_DEVICES=kvx0 on a netns host).
// --poll-loop: a thread calls poll() in a loop for as long as the transport
// is open, as an owner without a progress thread does.
// --guard-bytes maps G bytes of it_pool.h's kGuardByte right after the pool,
// in the same mapping but not registered (see the "guard" command).
// --shared-pool: the pool (and guard) is a kvxfer::SharedPool, which
// same-host initiators map.
// Registers a zeroed pool of B blocks of L bytes with a UCX transport (UCX
// TLS = T), prints "ready <base> <num_blocks> <block_len> <metadata hex>",
// then reads commands from stdin, answering each with one line:
//   verify G N l1 r1 ... lN rN  -> "ok" when block ri holds the pattern of
//                                  block li in generation G, else "bad ..."
//   watch N G                   -> takes notifications until N came, each
//                                  "seq l1 r1 ...", checking at arrival that
//                                  every ri holds li of generation G and the
//                                  sender's order; "watched <n> bad=<k>
//                                  out_of_order=<k>"
//   notes                       -> "notes <count> <agent>=<text>..."
//   fill G                      -> fills every block i with the pattern of
//                                  block i in generation G; "filled"
//   checksum                    -> "sum <fnv-1a of the whole pool>"
//   guard                       -> "guard ok" when the guard region is as
//                                  mapped, else "guard bad offset=<first change>"
//   close                       -> closes the transport (the pool stays
//                                  mapped, the process alive); "closed"
//   quit                        -> "bye", exit 0
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "it_lanes.h"
#include "it_pool.h"
#include "kvxfer/transport.h"

namespace {

KVXFER_IT_NO_TSAN std::uint64_t fnv1a(const std::uint8_t* data, std::uint64_t len) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::uint64_t i = 0; i < len; ++i) {
    h ^= data[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Calls poll() on the transport in a loop until stopped.
class Poller {
 public:
  explicit Poller(kvxfer::Transport& transport)
      : thread_([this, &transport] {
          while (!stop_.load()) {
            (void)transport.poll();
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
        }) {}
  ~Poller() {
    stop_.store(true);
    thread_.join();
  }
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

// Replies travel on a private copy of the stdout pipe, and fd 1 is pointed at
// stderr: UCX logs its errors to stdout (e.g. "recv(-1) failed" when the
// initiator force-closes an endpoint), and a log line read as the reply to a
// verify would shift every later reply by one.
class ReplyChannel {
 public:
  ReplyChannel() : fd_(::dup(STDOUT_FILENO)) {
    if (fd_ < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
      std::cerr << "cannot set up the reply channel\n";
      std::exit(2);
    }
  }
  ~ReplyChannel() { ::close(fd_); }
  ReplyChannel(const ReplyChannel&) = delete;
  ReplyChannel& operator=(const ReplyChannel&) = delete;

  void line(const std::string& text) const {
    const std::string data = text + "\n";
    std::size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::write(fd_, data.data() + off, data.size() - off);
      if (n <= 0) std::exit(1);  // the test process is gone
      off += static_cast<std::size_t>(n);
    }
  }

 private:
  int fd_;
};

int main(int argc, char** argv) {
  const ReplyChannel out;
  std::string name = "target";
  std::uint64_t num_blocks = 64;
  std::uint64_t block_len = 64 * 1024;
  std::string tls = "sm,self";
  bool progress_thread = true;
  std::uint64_t guard_bytes = 0;
  bool shared_pool = false;
  bool poll_loop = false;
  bool no_pool = false;
  std::map<std::string, std::string> engine_config;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "missing value for " << arg << "\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--name") {
      name = value();
    } else if (arg == "--blocks") {
      num_blocks = std::stoull(value());
    } else if (arg == "--block-len") {
      block_len = std::stoull(value());
    } else if (arg == "--tls") {
      tls = value();
    } else if (arg == "--config") {
      const std::string kv = value();
      const auto eq = kv.find('=');
      if (eq == std::string::npos) {
        std::cerr << "--config wants KEY=VALUE, got " << kv << "\n";
        return 2;
      }
      engine_config[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else if (arg == "--guard-bytes") {
      guard_bytes = std::stoull(value());
    } else if (arg == "--shared-pool") {
      shared_pool = true;
    } else if (arg == "--no-progress-thread") {
      progress_thread = false;
    } else if (arg == "--poll-loop") {
      poll_loop = true;
    } else if (arg == "--no-pool") {
      no_pool = true;
    } else {
      std::cerr << "unknown argument " << arg << "\n";
      return 2;
    }
  }

  kvxfer::it::MappedPool pool(num_blocks, block_len, guard_bytes, shared_pool);
  kvxfer::Options options;
  options.backends = {"UCX"};
  options.progress_thread = progress_thread;
  options.engine_config = engine_config;
  options.engine_config = kvxfer::it::with_tls(options.engine_config, tls);
  auto transport = std::make_unique<kvxfer::Transport>(
      name, no_pool ? kvxfer::Region{} : kvxfer::Region{pool.base(), num_blocks, block_len},
      options);
  // Regions besides the pool ("regions", "rsum", "rfill", "dereg").
  std::vector<std::vector<std::uint8_t>> regions;
  std::vector<kvxfer::RegionId> region_ids;
  // Stopped before the transport closes (declared after it: destroyed first).
  auto poller = poll_loop ? std::make_unique<Poller>(*transport) : nullptr;
  out.line("ready " + std::to_string(transport->base_addr()) + ' ' +
           std::to_string(transport->num_blocks()) + ' ' + std::to_string(transport->block_len()) +
           ' ' + kvxfer::it::to_hex(transport->agent_metadata()));

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "verify") {
      std::uint64_t gen = 0;
      std::size_t n = 0;
      in >> gen >> n;
      std::string reply = "ok";
      for (std::size_t i = 0; i < n; ++i) {
        std::uint64_t l = 0;
        std::uint64_t r = 0;
        in >> l >> r;
        if (!in || r >= num_blocks) {
          reply = "bad request";
          break;
        }
        const std::int64_t at = kvxfer::it::first_mismatch(pool.block(r), block_len, gen, l);
        if (at >= 0) {
          reply = "bad remote=" + std::to_string(r) + " local=" + std::to_string(l) +
                  " offset=" + std::to_string(at);
          break;
        }
      }
      out.line(reply);
    } else if ((cmd == "watch" || cmd == "notes") && transport == nullptr) {
      out.line("closed");
    } else if (cmd == "watch") {
      // watch N G: takes notifications until N have come (or 60 s pass).
      // Each is "seq l1 r1 l2 r2 ...": at arrival, every ri must already
      // hold the pattern of li in generation G, and seq must be its
      // sender's next.
      std::size_t want = 0;
      std::uint64_t gen = 0;
      in >> want >> gen;
      std::size_t got = 0;
      std::size_t bad = 0;
      std::size_t out_of_order = 0;
      std::map<std::string, std::uint64_t> next_seq;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (got < want && std::chrono::steady_clock::now() < deadline) {
        const auto notes = transport->get_notifications();
        if (notes.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
        for (const auto& [agent, messages] : notes) {
          for (const auto& m : messages) {
            ++got;
            std::istringstream fields(std::string(m.begin(), m.end()));
            std::uint64_t seq = 0;
            fields >> seq;
            if (seq != next_seq[agent]) ++out_of_order;
            next_seq[agent] = seq + 1;
            std::uint64_t l = 0;
            std::uint64_t r = 0;
            while (fields >> l >> r) {
              if (r >= num_blocks ||
                  kvxfer::it::first_mismatch(pool.block(r), block_len, gen, l) >= 0) {
                ++bad;
              }
            }
          }
        }
      }
      out.line("watched " + std::to_string(got) + " bad=" + std::to_string(bad) +
               " out_of_order=" + std::to_string(out_of_order));
    } else if (cmd == "notes") {
      // notes: the notifications queued now, "notes <count> <agent>=<text>...".
      std::string reply;
      std::size_t count = 0;
      for (const auto& [agent, messages] : transport->get_notifications()) {
        for (const auto& m : messages) {
          ++count;
          reply += ' ' + agent + '=' + std::string(m.begin(), m.end());
        }
      }
      out.line("notes " + std::to_string(count) + reply);
    } else if (cmd == "fill") {
      std::uint64_t gen = 0;
      in >> gen;
      pool.fill_generation_for_readers(gen);
      out.line("filled");
    } else if (cmd == "regions") {
      // regions N LEN: registers N zeroed buffers of LEN bytes; replies
      // "regions <metadata hex> <addr>..." (the metadata now lists them).
      std::size_t n = 0;
      std::uint64_t len = 0;
      in >> n >> len;
      std::string reply;
      for (std::size_t k = 0; k < n; ++k) {
        regions.emplace_back(len, 0);
        region_ids.push_back(transport->register_memory(regions.back().data(), len));
        reply += ' ' + std::to_string(reinterpret_cast<std::uintptr_t>(regions.back().data()));
      }
      out.line("regions " + kvxfer::it::to_hex(transport->agent_metadata()) + reply);
    } else if (cmd == "rsum" || cmd == "rfill" || cmd == "dereg") {
      std::size_t k = 0;
      in >> k;
      if (k >= regions.size()) {
        out.line("bad request");
      } else if (cmd == "rsum") {
        out.line("sum " + std::to_string(fnv1a(regions[k].data(), regions[k].size())));
      } else if (cmd == "rfill") {
        std::uint64_t seed = 0;
        in >> seed;
        for (std::size_t i = 0; i < regions[k].size(); ++i) {
          regions[k][i] = static_cast<std::uint8_t>(seed * 31 + i * 7 + k * 13);
        }
        out.line("filled");
      } else {
        transport->deregister_memory(region_ids[k]);
        out.line("dereg ok");
      }
    } else if (cmd == "checksum") {
      out.line("sum " + std::to_string(fnv1a(pool.base(), pool.len())));
    } else if (cmd == "guard") {
      const std::int64_t at = pool.guard_mismatch();
      out.line(at < 0 ? "guard ok" : "guard bad offset=" + std::to_string(at));
    } else if (cmd == "close") {
      poller.reset();
      transport.reset();
      out.line("closed");
    } else if (cmd == "quit") {
      poller.reset();
      transport.reset();
      out.line("bye");
      return 0;
    } else {
      out.line("unknown command");
    }
  }
  return 0;
}
