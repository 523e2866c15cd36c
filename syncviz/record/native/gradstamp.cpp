// Gradient-ready stamps taken in C++: a post hook on each parameter's AccumulateGrad node that
// appends (parameter index, CLOCK_MONOTONIC ns, micro-step) to a buffer the recorder takes once a
// step. The Python hook it replaces (register_post_accumulate_grad_hook) cost one C++ -> Python
// call per parameter per backward, +1.1-1.7 us each on this machine (~1.5 ms a step for the 1,200
// parameters of benchmarks/overhead_script.py many-params); this one is within the noise of no hook
// (benchmarks/grad_hooks.py).
//
// Order: the stamp goes first among the node's post hooks, so it is taken before DDP's reducer
// marks the gradient ready (and may launch its bucket's all-reduce): a bucket's ready time never
// follows its launch. The tensor's own post-accumulate hooks (Python ones included) run before any
// node post hook, as torch runs them inside AccumulateGrad.
#include <torch/extension.h>
#include <pybind11/numpy.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <time.h>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using torch::autograd::variable_list;

// A weak reference to a gradient accumulator, whichever pointer autograd hands it out as:
// c10::intrusive_ptr from torch 2.13, std::shared_ptr up to 2.12 (torch 2.11's headers rejected
// the intrusive one: seen on a lent H200, which then ran the Python hooks).
template <class P> struct WeakOf;
template <class T> struct WeakOf<std::shared_ptr<T>> { using type = std::weak_ptr<T>; };
template <class T, class N> struct WeakOf<c10::intrusive_ptr<T, N>> { using type = c10::weak_intrusive_ptr<T, N>; };
using NodePtr = std::decay_t<decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()))>;
using WeakNode = typename WeakOf<NodePtr>::type;

struct Buffer {
  std::mutex lock;             // a backward on several devices runs hooks on several threads
  std::vector<int64_t> rows;   // (index, t_ns, micro) triples, in stamp order
  std::atomic<int64_t> micro{-1};
};

struct Stamp : torch::autograd::FunctionPostHook {
  Stamp(int64_t index, std::shared_ptr<Buffer> buffer) : index(index), buffer(std::move(buffer)) {}

  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);   // time.monotonic_ns's clock
    const int64_t t = static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
    const int64_t micro = buffer->micro.load(std::memory_order_relaxed);
    std::lock_guard<std::mutex> guard(buffer->lock);
    buffer->rows.insert(buffer->rows.end(), {index, t, micro});
    return outputs;
  }

  // Compiled autograd collects a node's hooks through this, and the default throws, which would
  // fail the user's backward. Registering nothing leaves the stamp out of compiled backwards.
  // Both forms, neither marked override: torch 2.8 and later declare it const, 2.4-2.7 not, and
  // each release overrides the one it declares (the other is a harmless overload).
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const {}
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) {}

  int64_t index;
  std::shared_ptr<Buffer> buffer;
};

class ReadyLog {
 public:
  ReadyLog() : buffer_(std::make_shared<Buffer>()) {}
  ~ReadyLog() { remove(); }

  // Stamp ``param``'s gradient as ready after each accumulation, as parameter ``index``. Only for
  // a parameter whose node someone holds for as long as it trains (DDP's reducer): autograd keeps
  // a weak reference only, and a node made anew would not have the hook. This log holds it weakly
  // too, so a discarded DDP model's parameters are freed with it, and its hooks go with the node.
  void hook(const at::Tensor& param, int64_t index) {
    auto node = torch::autograd::impl::grad_accumulator(param);
    TORCH_CHECK(node, "syncviz: no gradient accumulator (not a leaf that requires grad)");
    auto& hooks = node->post_hooks();
    hooks.insert(hooks.begin(), std::make_unique<Stamp>(index, buffer_));
    held_.emplace_back(WeakNode(node), reinterpret_cast<std::uintptr_t>(hooks.front().get()));
  }

  void set_micro(int64_t micro) { buffer_->micro.store(micro, std::memory_order_relaxed); }

  // The rows stamped since the last take, as an int64 numpy array of shape (n, 3); the buffer is
  // emptied. A numpy array, not a torch tensor: torch::empty and .numpy() cost ~25 us a step more
  // in a traced loop (the dispatcher's path, run once a step with cold caches).
  pybind11::array_t<int64_t> take() {
    std::vector<int64_t> rows;
    {
      std::lock_guard<std::mutex> guard(buffer_->lock);
      rows.swap(buffer_->rows);
    }
    const pybind11::ssize_t n = static_cast<pybind11::ssize_t>(rows.size()) / 3;
    pybind11::array_t<int64_t> out({n, static_cast<pybind11::ssize_t>(3)});
    if (n) std::memcpy(out.mutable_data(), rows.data(), rows.size() * sizeof(int64_t));
    return out;
  }

  void clear() {
    std::lock_guard<std::mutex> guard(buffer_->lock);
    buffer_->rows.clear();
  }

  // Hooks in place: on nodes still alive.
  int64_t hooks() const {
    int64_t n = 0;
    for (const auto& entry : held_) n += entry.first.expired() ? 0 : 1;
    return n;
  }

  // Remove every hook this log added (the recorder's close).
  void remove() {
    for (auto& [weak, key] : held_) {
      if (auto node = weak.lock()) node->del_post_hook(key);
    }
    held_.clear();
  }

 private:
  std::shared_ptr<Buffer> buffer_;
  std::vector<std::pair<WeakNode, std::uintptr_t>> held_;
};

}  // namespace

void bind_timed_group(pybind11::module_& m);   // timedgroup.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<ReadyLog>(m, "ReadyLog")
      .def(pybind11::init<>())
      .def("hook", &ReadyLog::hook)
      .def("set_micro", &ReadyLog::set_micro)
      .def("take", &ReadyLog::take)
      .def("clear", &ReadyLog::clear)
      .def("hooks", &ReadyLog::hooks)
      .def("remove", &ReadyLog::remove);
  bind_timed_group(m);
}
