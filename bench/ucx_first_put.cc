// SPDX-License-Identifier: Apache-2.0
// What UCX itself does with a first pass: a target process maps a fresh
// pool (ucp_mem_map), an initiator process puts a freshly written buffer
// into it (ucp_put_nbx, then a flush), twice, and both passes are timed:
// the first meets pages no kernel copy has touched, the second the steady
// state. Beside kvxfer's figures (`kvxfer bench`'s 1st GB/s column), it
// shows whether UCX pays a first touch on this host (docs/performance.md,
// "First pass"). UCX_TLS is the caller's (sm,self for the shared-memory
// path NIXL takes on one host; the default if unset). A plain memcpy
// between two fresh buffers of the initiator runs in the same run, as the
// machine's own measure.
//
//   ucx_first_put [--region BYTES] [--put BYTES] [--window N] [--pool populated|written]
//
// --pool: the target's fresh pool as kvxfer bench's are (mmap with
// MAP_POPULATE: every page faulted in by the kernel; the default), or
// also written once by user space before it is mapped.
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::size_t region = std::size_t{256} << 20;
  std::size_t put = std::size_t{1} << 20;
  std::size_t window = 64;
  bool written = false;  // the target's pool written by user space, else MAP_POPULATE only
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ucx_first_put: %s\n", what.c_str());
  std::exit(2);
}

void check(ucs_status_t st, const char* what) {
  if (st != UCS_OK) die(std::string(what) + ": " + ucs_status_string(st));
}

// Anonymous memory with every page faulted in by the kernel (as kvxfer
// bench's pools), never copied by a syscall yet.
std::uint8_t* fresh(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  return static_cast<std::uint8_t*>(p);
}

void send_all(int fd, const void* data, std::size_t len) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (len > 0) {
    const ssize_t n = ::send(fd, p, len, 0);
    if (n <= 0) die("send");
    p += n;
    len -= static_cast<std::size_t>(n);
  }
}

void recv_all(int fd, void* data, std::size_t len) {
  auto* p = static_cast<std::uint8_t*>(data);
  while (len > 0) {
    const ssize_t n = ::recv(fd, p, len, 0);
    if (n <= 0) die("recv");
    p += n;
    len -= static_cast<std::size_t>(n);
  }
}

void send_blob(int fd, const void* data, std::uint64_t len) {
  send_all(fd, &len, sizeof len);
  send_all(fd, data, len);
}

std::vector<std::uint8_t> recv_blob(int fd) {
  std::uint64_t len = 0;
  recv_all(fd, &len, sizeof len);
  std::vector<std::uint8_t> out(len);
  recv_all(fd, out.data(), len);
  return out;
}

struct Ucp {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  Ucp() {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    check(ucp_init(&params, nullptr, &context), "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(context, &wp, &worker), "ucp_worker_create");
  }
  ~Ucp() {
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
  }
  Ucp(const Ucp&) = delete;
  Ucp& operator=(const Ucp&) = delete;

  void wait(void* request) {
    if (request == nullptr) return;
    if (UCS_PTR_IS_ERR(request)) check(UCS_PTR_STATUS(request), "request");
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    check(ucp_request_check_status(request), "request");
    ucp_request_free(request);
  }
};

// The target: maps its pool, sends its address, rkey and worker address,
// then progresses its worker (puts over a shared-memory FIFO are copied
// by the target's worker) and answers checks until told to stop.
int run_target(int fd, const Args& a) {
  Ucp ucp;
  std::uint8_t* pool = fresh(a.region);
  if (a.written) std::memset(pool, 0, a.region);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = pool;
  mp.length = a.region;
  ucp_mem_h memh = nullptr;
  check(ucp_mem_map(ucp.context, &mp, &memh), "ucp_mem_map");
  void* rkey = nullptr;
  std::size_t rkey_len = 0;
  check(ucp_rkey_pack(ucp.context, memh, &rkey, &rkey_len), "ucp_rkey_pack");
  ucp_address_t* address = nullptr;
  std::size_t address_len = 0;
  check(ucp_worker_get_address(ucp.worker, &address, &address_len), "ucp_worker_get_address");
  const auto base = reinterpret_cast<std::uint64_t>(pool);
  send_all(fd, &base, sizeof base);
  send_blob(fd, rkey, rkey_len);
  send_blob(fd, address, address_len);
  ucp_rkey_buffer_release(rkey);
  ucp_worker_release_address(ucp.worker, address);
  for (;;) {
    ucp_worker_progress(ucp.worker);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) continue;
    std::uint8_t command[2];
    recv_all(fd, command, sizeof command);
    if (command[0] == 'q') break;
    // 'v': every 4096th byte must hold command[1].
    std::uint64_t bad = 0;
    for (std::size_t i = 0; i < a.region; i += 4096) bad += pool[i] != command[1] ? 1 : 0;
    send_all(fd, &bad, sizeof bad);
  }
  ucp_mem_unmap(ucp.context, memh);
  ::munmap(pool, a.region);
  return 0;
}

double gbps(std::size_t bytes, Clock::duration d) {
  return static_cast<double>(bytes) / std::chrono::duration<double>(d).count() / 1e9;
}

int run_initiator(int fd, const Args& a) {
  Ucp ucp;
  std::uint64_t base = 0;
  recv_all(fd, &base, sizeof base);
  const std::vector<std::uint8_t> rkey_buf = recv_blob(fd);
  const std::vector<std::uint8_t> address = recv_blob(fd);
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ucp_ep_h ep = nullptr;
  check(ucp_ep_create(ucp.worker, &ep_params, &ep), "ucp_ep_create");
  ucp_rkey_h rkey = nullptr;
  check(ucp_ep_rkey_unpack(ep, rkey_buf.data(), &rkey), "ucp_ep_rkey_unpack");

  // The machine's own measure: memcpy between two fresh buffers, then again.
  std::uint8_t* src = fresh(a.region);
  std::uint8_t* copy = fresh(a.region);
  std::memset(src, 0x11, a.region);
  auto t0 = Clock::now();
  std::memcpy(copy, src, a.region);
  const double memcpy_first = gbps(a.region, Clock::now() - t0);
  t0 = Clock::now();
  std::memcpy(copy, src, a.region);
  const double memcpy_second = gbps(a.region, Clock::now() - t0);
  ::munmap(copy, a.region);

  const auto pass = [&](std::uint8_t value) {
    std::memset(src, value, a.region);  // written by user space just before, as a KV cache is
    std::vector<void*> requests;
    requests.reserve(a.window);
    ucp_request_param_t param{};
    const auto start = Clock::now();
    for (std::size_t off = 0; off < a.region; off += a.put) {
      const std::size_t len = std::min(a.put, a.region - off);
      void* r = ucp_put_nbx(ep, src + off, len, base + off, rkey, &param);
      if (UCS_PTR_IS_ERR(r)) check(UCS_PTR_STATUS(r), "ucp_put_nbx");
      if (r != nullptr) requests.push_back(r);
      if (requests.size() == a.window) {
        for (void* q : requests) ucp.wait(q);
        requests.clear();
      }
    }
    for (void* q : requests) ucp.wait(q);
    ucp.wait(ucp_ep_flush_nbx(ep, &param));
    const double result = gbps(a.region, Clock::now() - start);
    const std::uint8_t command[2] = {'v', value};
    send_all(fd, command, sizeof command);
    std::uint64_t bad = 0;
    recv_all(fd, &bad, sizeof bad);
    if (bad != 0) die(std::to_string(bad) + " pages of the target hold wrong bytes");
    return result;
  };
  const double first = pass(0x5a);
  const double second = pass(0xa5);
  const char* tls = std::getenv("UCX_TLS");
  std::printf(
      "ucx_first_put: UCX %s, UCX_TLS=%s, %zu MiB region (%s), %zu KiB puts, %zu in flight\n"
      "first  %.2f GB/s (a fresh buffer into the target's fresh pool)\n"
      "steady %.2f GB/s (the same buffers again)\n"
      "memcpy %.2f GB/s first, %.2f GB/s second (two fresh buffers of this process)\n",
      ucp_get_version_string(), tls != nullptr ? tls : "(default)", a.region >> 20,
      a.written ? "target pool written by user space" : "target pool MAP_POPULATE", a.put >> 10,
      a.window, first, second, memcpy_first, memcpy_second);
  // Closed (flushed) while the target still progresses, then it may go.
  ucp_rkey_destroy(rkey);
  ucp_request_param_t close_param{};
  ucp.wait(ucp_ep_close_nbx(ep, &close_param));
  const std::uint8_t quit[2] = {'q', 0};
  send_all(fd, quit, sizeof quit);
  ::munmap(src, a.region);
  return 0;
}

std::size_t size_arg(const char* text) {
  char* end = nullptr;
  std::size_t v = std::strtoull(text, &end, 10);
  if (end == text) die(std::string("not a size: ") + text);
  switch (*end) {
    case 'K':
    case 'k':
      v <<= 10;
      break;
    case 'M':
    case 'm':
      v <<= 20;
      break;
    case 'G':
    case 'g':
      v <<= 30;
      break;
    case '\0':
      break;
    default:
      die(std::string("not a size: ") + text);
  }
  return v;
}

}  // namespace

constexpr const char* kUsage =
    "usage: ucx_first_put [--region BYTES] [--put BYTES] [--window N] [--pool populated|written]";

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--region") {
      a.region = size_arg(argv[i + 1]);
    } else if (flag == "--put") {
      a.put = size_arg(argv[i + 1]);
    } else if (flag == "--window") {
      a.window = size_arg(argv[i + 1]);
    } else if (flag == "--pool" &&
               (std::string(argv[i + 1]) == "populated" || std::string(argv[i + 1]) == "written")) {
      a.written = std::string(argv[i + 1]) == "written";
    } else {
      die(kUsage);
    }
  }
  if (argc % 2 == 0 || a.region == 0 || a.put == 0 || a.window == 0) {
    die(kUsage);
  }
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) die("socketpair");
  const pid_t child = ::fork();
  if (child < 0) die("fork");
  if (child == 0) {
    ::close(fds[0]);
    return run_target(fds[1], a);
  }
  ::close(fds[1]);
  const int rc = run_initiator(fds[0], a);
  int status = 0;
  ::waitpid(child, &status, 0);
  return rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ? 1 : 0;
}
