// SPDX-License-Identifier: Apache-2.0
// The region and descriptor-list calls of kvxfer.Transport: register_memory,
// deregister_memory, regions, peer_regions, the metadata-only
// add_remote_peer, prepare and transfer, with the DescList class they pass
// around. This is the path NIXL's agent API takes (kvxfer.nixl). Arguments
// are converted, and each error names its argument, with the GIL held; the
// calls into the transport run with it released (see module.cc).
#include <Python.h>
#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include <bit>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arguments.h"
#include "kvxfer/metadata.h"
#include "kvxfer/transport.h"
#include "log_bridge.h"
#include "py_transport.h"

namespace kvxfer::python {
namespace {

// Whether `b` holds native 64-bit integers, and whether they are signed.
// numpy exports int64/uint64 as "l"/"q" and "L"/"Q", possibly with a
// byte-order prefix.
std::optional<bool> int64_signedness(const Py_buffer& b) {
  const char* f = b.format != nullptr ? b.format : "B";
  if (*f == '@' || *f == '=' || (*f == '<' && std::endian::native == std::endian::little)) ++f;
  if (b.itemsize != 8 || f[0] == '\0' || f[1] != '\0') return std::nullopt;
  if (std::strchr("lqn", f[0]) != nullptr) return true;
  if (std::strchr("LQN", f[0]) != nullptr) return false;
  return std::nullopt;
}

// An (N, 2..4) array of 64-bit integers: columns addr, len (dev and meta
// ignored). Strided arrays are read through their strides.
bool read_array_descs(py::handle obj, const char* name, std::vector<MemDesc>& out) {
  Py_buffer b{};
  if (PyObject_GetBuffer(obj.ptr(), &b, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  const auto release = [&b] { PyBuffer_Release(&b); };
  const std::optional<bool> is_signed = int64_signedness(b);
  if (b.ndim != 2 || b.shape[1] < 2 || b.shape[1] > 4 || !is_signed) {
    const std::string shape =
        b.ndim == 2 ? fmt::format("({}, {})", b.shape[0], b.shape[1]) : fmt::format("{}-D", b.ndim);
    release();
    throw py::value_error(fmt::format(
        "{} must be an (N, 2), (N, 3) or (N, 4) array of uint64 or int64 (addr, len[, dev[, "
        "meta]]); got {} with itemsize {}",
        name, shape, b.itemsize));
  }
  const auto n = static_cast<std::size_t>(b.shape[0]);
  out.resize(n);
  const auto* base = static_cast<const char*>(b.buf);
  for (std::size_t i = 0; i < n; ++i) {
    const char* row = base + static_cast<Py_ssize_t>(i) * b.strides[0];
    std::int64_t addr = 0;
    std::int64_t len = 0;
    std::memcpy(&addr, row, sizeof addr);
    std::memcpy(&len, row + b.strides[1], sizeof len);
    if (*is_signed && (addr < 0 || len < 0)) {
      release();
      throw py::value_error(
          fmt::format("{}[{}] has a negative address or length ({}, {})", name, i, addr, len));
    }
    out[i] = MemDesc{static_cast<std::uint64_t>(addr), static_cast<std::uint64_t>(len)};
  }
  release();
  return true;
}

std::uint64_t desc_field(PyObject* value, const char* name, std::size_t i, int field) {
  if (PyLong_CheckExact(value)) {
    const unsigned long long v = PyLong_AsUnsignedLongLong(value);
    if (!(v == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr)) return v;
    PyErr_Clear();
  }
  const std::string where =
      fmt::format("{}[{}][{}] ({})", name, i, field, field == 0 ? "addr" : "len");
  return uint_arg(py::handle(value), where.c_str());
}

// A list or tuple of (addr, len), (addr, len, dev) or (addr, len, dev, meta).
void read_tuple_descs(py::handle obj, const char* name, std::vector<MemDesc>& out) {
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) {
    throw py::type_error(fmt::format(
        "{} must be a list of (addr, len[, dev[, meta]]) tuples or an (N, 2..4) integer array; "
        "got {}",
        name, given(obj)));
  }
  const auto n = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(obj.ptr()));
  PyObject** items = PySequence_Fast_ITEMS(obj.ptr());
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    PyObject* item = items[i];
    if (!PyTuple_Check(item) && !PyList_Check(item)) {
      throw py::type_error(fmt::format("{}[{}] must be a tuple (addr, len[, dev[, meta]]); got {}",
                                       name, i, given(py::handle(item))));
    }
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(item);
    if (size < 2 || size > 4) {
      throw py::value_error(
          fmt::format("{}[{}] must hold 2 to 4 items (addr, len[, dev[, meta]]); "
                      "got {}",
                      name, i, given(py::handle(item))));
    }
    PyObject** fields = PySequence_Fast_ITEMS(item);
    out[i] = MemDesc{desc_field(fields[0], name, i, 0), desc_field(fields[1], name, i, 1)};
  }
}

// The descriptors as the core takes them, copied: nothing of `obj` is held
// after the call.
std::vector<MemDesc> desc_arg(py::handle obj, const char* name) {
  std::vector<MemDesc> out;
  const bool maybe_array =
      !PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr()) && PyObject_CheckBuffer(obj.ptr());
  if (!maybe_array || !read_array_descs(obj, name, out)) read_tuple_descs(obj, name, out);
  return out;
}

const DescList& desc_list_arg(py::handle obj, const char* name) {
  if (!py::isinstance<DescList>(obj)) {
    throw py::type_error(
        fmt::format("{} must be a kvxfer DescList (Transport.prepare); got {}", name, given(obj)));
  }
  return obj.cast<const DescList&>();
}

TransferOp op_arg(py::handle obj) {
  const std::string_view op = text_arg(obj, "op");
  if (op == "WRITE") return TransferOp::kWrite;
  if (op == "READ") return TransferOp::kRead;
  throw py::value_error(fmt::format("op must be \"WRITE\" or \"READ\"; got {}", given(obj)));
}

// None (no notification) or 1..kMaxNotificationBytes bytes, into `notify`
// (pinned while it lives).
void notify_arg(py::handle obj, std::optional<ByteArg>& notify) {
  if (obj.is_none()) return;
  notify.emplace(obj, "notify");
  if (notify->span().empty()) {
    throw py::value_error("notify must hold at least one byte (None: no notification)");
  }
  if (notify->span().size() > kMaxNotificationBytes) {
    throw py::value_error(fmt::format("notify must hold at most {} bytes; got {}",
                                      kMaxNotificationBytes, notify->span().size()));
  }
}

py::object transfer(PyTransport& self, py::handle op_obj, py::handle peer_obj, py::handle local_obj,
                    py::handle local_idx_obj, py::handle remote_obj, py::handle remote_idx_obj,
                    py::handle notify_obj) {
  follow_log_level();
  const TransferOp op = op_arg(op_obj);
  const std::string_view peer = text_arg(peer_obj, "peer_id");
  const DescList& local = desc_list_arg(local_obj, "local");
  const DescList& remote = desc_list_arg(remote_obj, "remote");
  if (local_idx_obj.is_none() != remote_idx_obj.is_none()) {
    throw py::type_error(
        "local_idx and remote_idx must both be index lists, or both None (whole lists)");
  }
  std::optional<ByteArg> notify;
  notify_arg(notify_obj, notify);
  const std::span<const std::uint8_t> message =
      notify ? notify->span() : std::span<const std::uint8_t>{};
  std::optional<TransferId> id;
  if (local_idx_obj.is_none()) {
    py::gil_scoped_release nogil;
    id = self.get().transfer(op, peer, local, remote, message);
  } else {
    std::vector<std::int64_t> local_copy;
    std::vector<std::int64_t> remote_copy;
    IndexArg local_idx(local_idx_obj, "local_idx", local_copy);
    IndexArg remote_idx(remote_idx_obj, "remote_idx", remote_copy);
    local_idx.widen();
    remote_idx.widen();
    py::gil_scoped_release nogil;
    id = self.get().transfer(op, peer, local, local_idx.int64(), remote, remote_idx.int64(),
                             message);
  }
  return id ? py::object(py::int_(*id)) : py::object(py::none());
}

py::list region_list(const std::vector<RegionInfo>& regions) {
  py::list out(regions.size());
  for (std::size_t i = 0; i < regions.size(); ++i) {
    out[i] = py::make_tuple(regions[i].id, regions[i].addr, regions[i].len);
  }
  return out;
}

void add_desc_list(py::module_& m) {
  py::class_<DescList>(m, "DescList",
                       "A descriptor list checked once against the regions it lies in\n"
                       "(Transport.prepare); transfers name its descriptors by index.")
      .def("__len__", &DescList::size)
      .def_property_readonly("remote", &DescList::remote,
                             "Whether it was prepared against a peer's regions.")
      .def_property_readonly("peer", &DescList::peer,
                             "The peer it was prepared for; \"\" if local.")
      .def(
          "__getitem__",
          [](const DescList& list, std::int64_t i) {
            const auto n = static_cast<std::int64_t>(list.size());
            if (i < -n || i >= n) {
              throw py::index_error(fmt::format("index {} is outside the list of {}", i, n));
            }
            const MemDesc d = list.at(static_cast<std::size_t>(i < 0 ? i + n : i));
            return py::make_tuple(d.addr, d.len);
          },
          py::arg("index"), "The descriptor at index as (addr, len), as it was given.")
      .def("__repr__", [](const DescList& list) {
        return list.remote()
                   ? fmt::format("<kvxfer.DescList of {} for peer {}>", list.size(), list.peer())
                   : fmt::format("<kvxfer.DescList of {}, local>", list.size());
      });
  m.def(
      "metadata_agent_name",
      [](py::handle metadata) {
        const ByteArg bytes(metadata, "metadata");
        return metadata_agent_name(bytes.span());
      },
      py::arg("metadata"),
      "The agent name inside an agent's metadata (ValueError for bytes that are not\n"
      "kvxfer metadata).");
}

void add_memory_calls(py::class_<PyTransport>& cls) {
  cls.def(
         "register_memory",
         [](PyTransport& self, py::handle addr, py::handle length) {
           follow_log_level();
           const std::uint64_t a = uint_arg(addr, "addr");
           const std::uint64_t n = uint_arg(length, "length");
           py::gil_scoped_release nogil;
           return self.get().register_memory(reinterpret_cast<const void*>(a), n);
         },
         py::arg("addr"), py::arg("length"),
         "Registers length bytes from addr (memory the caller keeps alive until it is\n"
         "deregistered) besides the pool; returns the region id. ValueError for a bad or\n"
         "overlapping range, RuntimeError when an engine lane cannot take it.")
      .def(
          "deregister_memory",
          [](PyTransport& self, py::handle region_id) {
            follow_log_level();
            const std::uint64_t id = uint_arg(region_id, "region_id");
            py::gil_scoped_release nogil;
            self.get().deregister_memory(id);
          },
          py::arg("region_id"),
          "Unregisters a region (ValueError for an unknown id, RuntimeError while\n"
          "transfers between regions are in flight).")
      .def(
          "regions",
          [](PyTransport& self) {
            std::vector<RegionInfo> regions;
            {
              py::gil_scoped_release nogil;
              regions = self.get().regions();
            }
            return region_list(regions);
          },
          "Our regions besides the pool, in address order: [(id, addr, len), ...].")
      .def(
          "peer_regions",
          [](PyTransport& self, py::handle peer_id) {
            const std::string id(text_arg(peer_id, "peer_id"));
            std::vector<RegionInfo> regions;
            {
              py::gil_scoped_release nogil;
              regions = self.get().peer_regions(id);
            }
            return region_list(regions);
          },
          py::arg("peer_id"),
          "A peer's regions as its metadata listed them: [(id, addr, len), ...].");
}

void add_list_calls(py::class_<PyTransport>& cls) {
  cls.def(
         "add_remote_peer",
         [](PyTransport& self, py::handle peer_id, py::handle agent_metadata) {
           follow_log_level();
           const std::string id(text_arg(peer_id, "peer_id"));
           const ByteArg metadata(agent_metadata, "agent_metadata");
           py::gil_scoped_release nogil;
           self.get().add_remote_peer(id, metadata.span());
         },
         py::arg("peer_id"), py::arg("agent_metadata"),
         "Registers a peer from its metadata alone: its pool (if any) and its regions\n"
         "are what the metadata lists.")
      .def(
          "prepare",
          [](PyTransport& self, py::handle descs, py::handle peer_id) {
            follow_log_level();
            const std::vector<MemDesc> list = desc_arg(descs, "descs");
            std::optional<std::string> peer;
            if (!peer_id.is_none()) peer.emplace(text_arg(peer_id, "peer_id"));
            py::gil_scoped_release nogil;
            return peer ? self.get().prepare(list, std::string_view(*peer))
                        : self.get().prepare(list);
          },
          py::arg("descs"), py::arg("peer_id") = py::none(),
          "Checks a descriptor list once: a list of (addr, len[, dev[, meta]]) tuples or\n"
          "an (N, 2..4) uint64/int64 array. Each descriptor must lie inside one region\n"
          "(of the peer's, with peer_id; else of ours) or the pool. Returns a DescList;\n"
          "ValueError names the first descriptor that does not fit.")
      .def("transfer", &transfer, py::arg("op"), py::arg("peer_id"), py::arg("local"),
           py::arg("local_idx"), py::arg("remote"), py::arg("remote_idx"),
           py::arg("notify") = py::none(),
           "Posts one \"WRITE\" (local -> remote) or \"READ\" (remote -> local) of\n"
           "local[local_idx[i]] and remote[remote_idx[i]] for every i (both index lists\n"
           "None: the whole lists, pair by pair). Returns the transfer id, which poll()\n"
           "reports like write_blocks', or None when the peer is unknown or the post\n"
           "failed. notify as for write_blocks.");
}

}  // namespace

void add_regions(py::module_& m, py::class_<PyTransport>& cls) {
  add_desc_list(m);
  add_memory_calls(cls);
  add_list_calls(cls);
}

}  // namespace kvxfer::python
