// troupe_torch._C: the Python face of the bridge. It exposes
// ProcessGroupTroupe (a torch.distributed ProcessGroup) and the creator that
// troupe_torch/__init__.py registers as the backend "troupe".

#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/Types.hpp>

#include "../src/callback_pool.hpp"
#include "troupe/world.hpp"
#include "troupe_torch/process_group.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "troupe as a torch.distributed backend";
  // Torch's c10d types (ProcessGroup, Store, _DistributedBackendOptions)
  // must be registered with pybind11 before ours refer to them.
  py::module::import("torch.distributed");

  py::class_<troupe_torch::ProcessGroupTroupe, c10d::ProcessGroup,
             c10::intrusive_ptr<troupe_torch::ProcessGroupTroupe>>(m, "ProcessGroupTroupe",
                                                                   R"(
A torch.distributed ProcessGroup whose calls run on troupe.

ProcessGroupTroupe(store, rank, size, timeout) joins a troupe world of its
own through a torch store; torch.distributed.init_process_group("troupe")
makes one per group through the registered creator instead.)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<troupe_torch::ProcessGroupTroupe>(store, rank, size,
                                                                          timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout") = std::chrono::milliseconds(kProcessGroupDefaultTimeout),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly(
          "group_name",
          [](const troupe_torch::ProcessGroupTroupe& pg) { return pg.group().name(); })
      .def_property_readonly("global_ranks", [](const troupe_torch::ProcessGroupTroupe& pg) {
        return pg.group().global_ranks();
      });

  troupe_torch::detail::set_gil_releaser([](const std::function<void()>& f) {
    if (PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      f();
    } else {
      f();
    }
  });

  m.def(
      "_create_process_group",
      [](const c10d::DistributedBackendOptions& opts, const py::object& /*pg_options*/) {
        py::gil_scoped_release no_gil;  // the rendezvous blocks
        return troupe_torch::ProcessGroupTroupe::create(opts);
      },
      py::arg("dist_backend_opts"), py::arg("pg_options"),
      "The creator torch.distributed calls for the backend 'troupe' (extended API).");

  m.def(
      "_wait_for_completions",
      [](double seconds) {
        return troupe_torch::wait_for_completions(
            std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000)));
      },
      py::arg("seconds"), py::call_guard<py::gil_scoped_release>(),
      "Waits until no future completion is queued or running (called at exit).");
}
