// DDP's default bucket all-reduce timed in C++: the process group DDP's reducer gets on the CPU
// (record/timed_group.py installs it, as record/reducer_group.py installs its Python twin). The
// reducer calls ``allreduce({bucket})``; this group stamps the call, issues it on the real group,
// and hands back a work whose future completes only once the done time is stamped (the reducer
// waits on that future, so a bucket is never taken unfinished). Every other collective (bucket
// rebuilds broadcast, the unused-parameter map) goes to the real group's backends, registered on
// this group, through ProcessGroup's own dispatch: no Python and no GIL anywhere on this path.
//
// Why: through the Python subclass each bucket cost a C++ -> Python call, ~5 Python objects, and
// a Python callback on gloo's thread that has to take the GIL from the training thread: ~70 us of
// rank 0's CPU a bucket in a traced short-steps run besides gloo's own enqueue (py-spy, 500 Hz).
//
// The row a bucket leaves: (index, layout, micro, launch ns, done ns, numel, scalar type). Its
// index is numbered here as record/ddp.py's _BucketHook._number numbers it: the reducer issues
// buckets strictly in index order, once per backward, so the calls are counted from the last
// forward (next_pass) and each is checked against the current layout's bucket sizes.
#include <torch/extension.h>
#include <pybind11/numpy.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <time.h>
#include <utility>
#include <vector>

// A ProcessGroup subclass with its own backends needs ProcessGroup::setDefaultBackend and
// strToBackendType, which torch has from 2.6 (checked by compiling against each release's headers,
// 2.4 to 2.14). Before that this file defines no group, and DDP's buckets go through the Python one.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
#define SYNCVIZ_TIMED_GROUP 1
#endif

#ifdef SYNCVIZ_TIMED_GROUP
namespace {

constexpr int kCols = 7;   // index, layout, micro, launch, done, numel, scalar type

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);   // time.monotonic_ns's clock, as gradstamp.cpp's stamps
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

struct Rows {
  std::mutex lock;             // the done stamp comes from the backend's thread
  std::vector<int64_t> rows;   // kCols per bucket, in call order
  int64_t first_seq = 0;       // sequence number of rows' first bucket (take() empties rows)
  int64_t next_seq = 0;
};

class TimedWork : public c10d::Work {
 public:
  TimedWork(c10::intrusive_ptr<c10d::Work> work, c10::intrusive_ptr<c10::ivalue::Future> fut)
      : work_(std::move(work)), fut_(std::move(fut)) {}

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return fut_; }
  bool isCompleted() override { return fut_->completed(); }
  bool isSuccess() const override { return fut_->completed() && !fut_->hasError(); }
  std::vector<at::Tensor> result() override { return work_->result(); }
  void synchronize() override { work_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override {
    const bool ok = work_->wait(timeout);
    fut_->waitAndThrow();     // the done stamp is in once this returns
    return ok;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
};

class TimedGroup : public c10d::ProcessGroup {
 public:
  explicit TimedGroup(const c10::intrusive_ptr<c10d::ProcessGroup>& inner)
      : c10d::ProcessGroup(inner->getRank(), inner->getSize()), inner_(inner), rows_(std::make_shared<Rows>()) {
    for (const auto& device : inner->getDeviceTypes()) {
      auto backend = inner->getBackend(device.type());
      setBackend(device.type(), strToBackendType(backend->getBackendName()), backend);
    }
    setDefaultBackend(inner->getBackendType());
  }

  const std::string getBackendName() const override { return inner_->getBackendName(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (tensors.size() != 1 || !tensors[0].is_floating_point()) {
      return inner_->allreduce(tensors, opts);    // e.g. the unused-parameter map (int32)
    }
    const at::Tensor& t = tensors[0];
    const int64_t numel = t.numel();
    const int64_t launch = monotonic_ns();
    auto work = inner_->allreduce(tensors, opts);
    int64_t seq;
    {
      std::lock_guard<std::mutex> guard(rows_->lock);
      const int64_t index = number(numel);
      seq = rows_->next_seq++;
      rows_->rows.insert(rows_->rows.end(), {index, layout_, micro_.load(), launch, -1, numel,
                                             static_cast<int64_t>(t.scalar_type())});
    }
    auto fut = work->getFuture();
    auto rows = rows_;
    auto stamped = fut->then(
        [rows, seq](c10::ivalue::Future& done) {
          const int64_t t_done = monotonic_ns();
          {
            std::lock_guard<std::mutex> guard(rows->lock);
            const int64_t at = seq - rows->first_seq;    // < 0: taken unfinished (the step ended first)
            if (at >= 0 && (at + 1) * kCols <= static_cast<int64_t>(rows->rows.size())) {
              rows->rows[at * kCols + 4] = t_done;
            }
          }
          return done.value();     // an all-reduce's error reaches the reducer as before
        },
        fut->elementType());
    return c10::make_intrusive<TimedWork>(std::move(work), std::move(stamped));
  }

  // The current bucket layout (version and each bucket's numel): after each of DDP's forwards.
  void set_layout(int64_t layout, std::vector<int64_t> sizes) {
    std::lock_guard<std::mutex> guard(rows_->lock);
    layout_ = layout;
    sizes_ = std::move(sizes);
  }

  void next_pass() {          // a forward: the next backward reduces buckets from 0
    std::lock_guard<std::mutex> guard(rows_->lock);
    next_ = 0;
  }

  void set_micro(int64_t micro) { micro_ = micro; }

  // The buckets called since the last take, int64 (n, 7); a bucket not done yet has done -1.
  pybind11::array_t<int64_t> take() {
    std::vector<int64_t> rows;
    {
      std::lock_guard<std::mutex> guard(rows_->lock);
      rows.swap(rows_->rows);
      rows_->first_seq = rows_->next_seq;
    }
    return as_array(rows);
  }

  // The buckets called and not done, without taking them (the hang watchdog's thread).
  pybind11::array_t<int64_t> inflight() {
    std::vector<int64_t> open;
    {
      std::lock_guard<std::mutex> guard(rows_->lock);
      const auto& rows = rows_->rows;
      for (size_t i = 0; i + kCols <= rows.size(); i += kCols) {
        if (rows[i + 4] < 0) open.insert(open.end(), rows.begin() + i, rows.begin() + i + kCols);
      }
    }
    return as_array(open);
  }

 private:
  // _BucketHook._number: the next bucket in order, checked by its size; if the calls and the
  // buckets are out of step, the next bucket of that size (then the first). Under rows_->lock.
  int64_t number(int64_t numel) {
    const int64_t n = static_cast<int64_t>(sizes_.size());
    int64_t i = next_;
    if (i >= n || sizes_[i] != numel) {
      int64_t first = -1, after = -1;
      for (int64_t k = 0; k < n; ++k) {
        if (sizes_[k] != numel) continue;
        if (first < 0) first = k;
        if (after < 0 && k >= i) after = k;
      }
      if (first >= 0) i = after >= 0 ? after : first;
    }
    next_ = (i + 1 < n || n == 0) ? i + 1 : 0;
    return i;
  }

  static pybind11::array_t<int64_t> as_array(const std::vector<int64_t>& rows) {   // with the GIL
    const pybind11::ssize_t n = static_cast<pybind11::ssize_t>(rows.size()) / kCols;
    pybind11::array_t<int64_t> out({n, static_cast<pybind11::ssize_t>(kCols)});
    if (n) std::memcpy(out.mutable_data(), rows.data(), rows.size() * sizeof(int64_t));
    return out;
  }

  c10::intrusive_ptr<c10d::ProcessGroup> inner_;
  std::shared_ptr<Rows> rows_;
  std::vector<int64_t> sizes_;
  int64_t layout_ = 0;
  int64_t next_ = 0;
  std::atomic<int64_t> micro_{-1};
};

}  // namespace
#endif  // SYNCVIZ_TIMED_GROUP

// Called from gradstamp.cpp's module definition (one extension, one build).
void bind_timed_group(pybind11::module_& m) {
#ifndef SYNCVIZ_TIMED_GROUP
  (void)m;              // torch before 2.6: no TimedGroup (record/timed_group.py checks)
#else
  try {
    pybind11::module_::import("torch.distributed");   // ProcessGroup's Python type, the base below
  } catch (const pybind11::error_already_set&) {
    return;             // a torch without distributed: no TimedGroup (record/timed_group.py checks)
  }
  pybind11::class_<TimedGroup, c10d::ProcessGroup, c10::intrusive_ptr<TimedGroup>>(m, "TimedGroup")
      .def(pybind11::init<const c10::intrusive_ptr<c10d::ProcessGroup>&>())
      .def("set_layout", &TimedGroup::set_layout)
      .def("next_pass", &TimedGroup::next_pass)
      .def("set_micro", &TimedGroup::set_micro)
      .def("take", &TimedGroup::take)
      .def("inflight", &TimedGroup::inflight)
      .def_static("dtype", [](int64_t code) { return static_cast<at::ScalarType>(code); });
#endif
}
