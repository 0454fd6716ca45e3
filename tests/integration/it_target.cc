// kvxfer_it_target: the far side of the multi-process UCX tests.
//
//   kvxfer_it_target --name N --blocks B --block-len L --tls T [--no-progress-thread]
//
// Registers a zeroed pool of B blocks of L bytes with a UCX transport (UCX
// TLS = T), prints "ready <base> <num_blocks> <block_len> <metadata hex>",
// then reads commands from stdin, answering each with one line:
//   verify G N l1 r1 ... lN rN  -> "ok" when block ri holds the pattern of
//                                  block li in generation G, else "bad ..."
//   checksum                    -> "sum <fnv-1a of the whole pool>"
//   close                       -> closes the transport (the pool stays
//                                  mapped, the process alive); "closed"
//   quit                        -> "bye", exit 0
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

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

}  // namespace

int main(int argc, char** argv) {
  std::string name = "target";
  std::uint64_t num_blocks = 64;
  std::uint64_t block_len = 64 * 1024;
  std::string tls = "sm,self";
  bool progress_thread = true;
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
    } else if (arg == "--no-progress-thread") {
      progress_thread = false;
    } else {
      std::cerr << "unknown argument " << arg << "\n";
      return 2;
    }
  }

  kvxfer::it::MappedPool pool(num_blocks, block_len);
  kvxfer::Options options;
  options.backends = {"UCX"};
  options.progress_thread = progress_thread;
  options.engine_config = {{"TLS", tls}};
  auto transport = std::make_unique<kvxfer::Transport>(
      name, kvxfer::Region{pool.base(), num_blocks, block_len}, options);
  std::cout << "ready " << transport->base_addr() << ' ' << transport->num_blocks() << ' '
            << transport->block_len() << ' ' << kvxfer::it::to_hex(transport->agent_metadata())
            << std::endl;

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
      std::cout << reply << std::endl;
    } else if (cmd == "checksum") {
      std::cout << "sum " << fnv1a(pool.base(), pool.len()) << std::endl;
    } else if (cmd == "close") {
      transport.reset();
      std::cout << "closed" << std::endl;
    } else if (cmd == "quit") {
      transport.reset();
      std::cout << "bye" << std::endl;
      return 0;
    } else {
      std::cout << "unknown command" << std::endl;
    }
  }
  return 0;
}
