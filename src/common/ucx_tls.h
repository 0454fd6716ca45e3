// SPDX-License-Identifier: Apache-2.0
// UCX_TLS, parsed in one place: the UCX engine asks which transports its
// context may use (and so which lanes and defaults apply), and the tools ask
// whether a run is TCP-only (kvxfer/ucx_tls.h, ucx_tls.cc).
#pragma once

#include <algorithm>
#include <array>
#include <initializer_list>
#include <string>
#include <string_view>

namespace kvxfer::internal {

// Whether a UCX_TLS value allows any of `names`: "all", a list naming one of
// them, or a "^" exclusion list naming none. A leading backslash (as UCX
// allows) is ignored; an empty value allows nothing by name.
[[nodiscard]] inline bool tls_allows(std::string_view tls,
                                     std::initializer_list<std::string_view> names) {
  while (!tls.empty() && tls.front() == '\\') tls.remove_prefix(1);
  const bool exclude = !tls.empty() && tls.front() == '^';
  if (exclude) tls.remove_prefix(1);
  bool named = false;
  while (!tls.empty()) {
    const std::size_t comma = tls.find(',');
    const std::string_view item = tls.substr(0, comma);
    if (std::find(names.begin(), names.end(), item) != names.end()) named = true;
    if (!exclude && item == "all") named = true;
    tls = comma == std::string_view::npos ? std::string_view{} : tls.substr(comma + 1);
  }
  return exclude ? !named : named;
}

// The value without UCX's shared-memory transports (posix, sysv, xpmem,
// knem, cma and their aliases sm, shm, mm): "all" becomes "^sm", an
// exclusion list gains "sm", a list loses them (and is "self" when nothing
// is left).
[[nodiscard]] inline std::string tls_without_shared_memory(std::string_view tls) {
  constexpr std::array<std::string_view, 8> kShm = {"sm",   "shm",   "mm",   "posix",
                                                    "sysv", "xpmem", "knem", "cma"};
  std::string_view rest = tls;
  while (!rest.empty() && rest.front() == '\\') rest.remove_prefix(1);
  if (rest.empty() || rest == "all") return "^sm";
  const bool exclude = rest.front() == '^';
  if (exclude) {
    return tls_allows(tls, {"sm"}) && tls_allows(tls, {"shm"}) ? std::string(tls) + ",sm"
                                                               : std::string(tls);
  }
  std::string out;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    std::string_view bare = item;
    while (!bare.empty() && bare.front() == '\\') bare.remove_prefix(1);
    if (bare == "all") return "^sm";
    if (!bare.empty() && std::find(kShm.begin(), kShm.end(), bare) == kShm.end()) {
      if (!out.empty()) out += ',';
      out += item;
    }
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return out.empty() ? "self" : out;
}

// Whether TCP is the only way the value lets two processes reach each other
// (no shared-memory transport allowed).
[[nodiscard]] inline bool tls_is_tcp_only(std::string_view tls) {
  return tls_allows(tls, {"tcp"}) && !tls_allows(tls, {"sm", "shm", "posix", "sysv", "cma"});
}

}  // namespace kvxfer::internal
