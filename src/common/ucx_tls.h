// UCX_TLS, parsed in one place: the UCX engine asks which transports its
// context may use (and so which lanes and defaults apply), and the bench asks
// whether a run is TCP-only. Header-only so the tools can use it too.
#pragma once

#include <algorithm>
#include <initializer_list>
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

// Whether TCP is the only way the value lets two processes reach each other
// (no shared-memory transport allowed).
[[nodiscard]] inline bool tls_is_tcp_only(std::string_view tls) {
  return tls_allows(tls, {"tcp"}) && !tls_allows(tls, {"sm", "shm", "posix", "sysv", "cma"});
}

}  // namespace kvxfer::internal
