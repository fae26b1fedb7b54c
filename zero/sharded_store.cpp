#include "zero/sharded_store.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"
#include "core/optimizer.hpp"

namespace colossal::zero {

namespace k = core::kernels;

ShardedParameterStore::ShardedParameterStore(std::vector<core::ParamUnit> units,
                                             std::size_t flat_size, int stage,
                                             parallel::Communicator& dp,
                                             core::MemoryTracker& tracker,
                                             double offload_params, bool bf16_reduce,
                                             bool gradients)
    : ParameterStore(std::move(units), flat_size),
      stage_(stage),
      dp_(dp),
      ranks_(dp.size()),
      rank_(dp.rank()),
      offload_params_(offload_params > 0.0),
      has_gradients_(gradients) {
  if (stage != 2 && stage != 3) {
    throw std::invalid_argument("sharded parameter store for ZeRO stage " + std::to_string(stage));
  }
  if (offload_params_ && stage != 3) {
    throw std::invalid_argument("parameter offload needs ZeRO stage 3");
  }
  std::size_t widest = 0;
  for (std::size_t u = 0; u < this->units().size(); ++u) {
    if (this->units()[u].size() % (std::size_t(ranks_) * 16) != 0) {
      throw std::invalid_argument("parameter unit " + std::to_string(u) +
                                  " is not padded to a multiple of dp*16 floats");
    }
    if (u > 0) widest = std::max(widest, this->units()[u].size());
  }
  const std::size_t first = this->units()[0].size();
  using core::MemCategory;
  if (stage == 2) {
    params_ = core::DeviceArray<float>(tracker, MemCategory::parameters, flat_size);
  } else {
    host_states_ = offload_params_ ? core::offloaded_states(shard_size(), offload_params) : 0;
    shard_ = core::DeviceArray<float>(tracker, MemCategory::parameters,
                                      shard_size() - host_states_);
    if (offload_params_) {
      host_shard_ = core::DeviceArray<float>(tracker, MemCategory::offloaded, shard_size());
    }
    if (!direct()) {
      param_work_[0] = core::DeviceArray<float>(tracker, MemCategory::parameters, first);
      param_work_[1] = core::DeviceArray<float>(tracker, MemCategory::parameters, widest);
    }
    if (prefetching()) {
      prefetch_work_ = core::DeviceArray<float>(tracker, MemCategory::parameters, widest);
    }
    if (offload_params_) uploads_ = std::make_unique<core::CopyQueue>();
    // A backward's gathers: the final unit, each block's up to four (its recomputed segments'
    // for both of its ops, its MLP's and its attention's backward).
    planned_.reserve(4 * this->units().size() + 4);
  }
  if (!has_gradients_) return;  // inference: parameters only
  grad_shard_ = core::DeviceArray<float>(tracker, MemCategory::gradients, shard_size());
  if (ranks_ > 1) {
    grad_work_[0] = core::DeviceArray<float>(tracker, MemCategory::gradients, first);
    grad_work_[1] = core::DeviceArray<float>(tracker, MemCategory::gradients, widest);
    if (bf16_reduce) {
      grad_wire_[0] = core::DeviceArray<std::uint16_t>(tracker, MemCategory::gradients, first);
      grad_wire_[1] = core::DeviceArray<std::uint16_t>(tracker, MemCategory::gradients, widest);
    } else {
      grad_spare_ = core::DeviceArray<float>(tracker, MemCategory::gradients, widest);
    }
  }
}

std::vector<std::pair<std::size_t, std::size_t>> ShardedParameterStore::owned_ranges() const {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (std::size_t u = 0; u < units().size(); ++u) {
    const std::size_t begin = units()[u].begin + rank_ * slice(int(u));
    ranges.emplace_back(begin, begin + slice(int(u)));
  }
  return ranges;
}

void ShardedParameterStore::take(int unit, int holders[2], const char* what) {
  int& holder = holders[slot(unit)];
  if (holder != -1) {
    throw std::logic_error(std::string("ZeRO store: ") + what + " of unit " +
                           std::to_string(unit) + " while unit " + std::to_string(holder) +
                           " still holds its buffer");
  }
  holder = unit;
}

std::size_t ShardedParameterStore::on_device(std::size_t at, std::size_t n) const {
  const std::size_t split = shard_size() - host_states_;
  return at < split ? std::min(n, split - at) : 0;
}

bool ShardedParameterStore::shard_to(float* device, std::size_t at, std::size_t n,
                                     core::CopyQueue* queue) {
  const std::size_t on_device = this->on_device(at, n);
  if (on_device > 0) k::copy(device, shard_.data() + at, int64_t(on_device));
  if (n == on_device) return false;
  float* dst = device + on_device;
  const float* src = host_shard_.data() + at + on_device;
  const std::size_t bytes = (n - on_device) * sizeof(float);
  if (queue != nullptr) {
    // Beside the kernels queued after it, but after those queued so far, which may still read
    // the buffer.
    queue->follow_kernels();
    queue->to_device(dst, src, bytes);
  } else {
    core::copy_to_device(dst, src, bytes);
  }
  uploaded_bytes_ += bytes;
  return true;
}

void ShardedParameterStore::shard_from(const float* device, std::size_t at, std::size_t n) {
  const std::size_t on_device = this->on_device(at, n);
  if (on_device > 0) {
    k::copy(shard_.data() + at, device, int64_t(on_device));
    core::fence_kernels();
  }
  if (n > on_device) {
    core::copy_to_host(host_shard_.data() + at + on_device, device + on_device,
                       (n - on_device) * sizeof(float));
  }
}

float* ShardedParameterStore::own_slice(int unit, float* work) {
  const std::size_t s = slice(unit);
  float* own = work + rank_ * s;
  shard_to(own, shard_offset(unit), s);
  return own;
}

void ShardedParameterStore::start_prefetch(int unit) {
  float* work = prefetch_work_.data();
  if (work == nullptr) return;  // a dry run (MemoryTracker::set_dry_run)
  const std::size_t s = slice(unit), at = shard_offset(unit);
  float* own = work + rank_ * s;
  // A dropped prefetch's upload may still be writing this buffer: the kernel below waits for it.
  order_kernels_after_uploads();
  // The slice's device part by a kernel; its host part on the upload queue, beside the kernels
  // of the unit in use.
  if (shard_to(own, at, s, uploads_.get())) {
    upload_pending_ = uploads_unordered_ = uploads_unwaited_ = true;
  }
  prefetched_ = unit;  // from here on drop_prefetch() completes whatever was started
  if (ranks_ > 1) {
    // The gather reads the uploaded part: NCCL's stream waits for the upload; a transport the
    // host drives needs it done.
    if (upload_pending_) {
      if (void* stream = dp_.transport_stream()) {
        uploads_->precede(stream);
      } else {
        wait_uploads();
      }
    }
    prefetch_pending_ = dp_.start_all_gather({own, s}, {work, units()[unit].size()});
  }
}

void ShardedParameterStore::order_kernels_after_uploads() {
  if (!uploads_unordered_) return;
  uploads_->precede();
  uploads_unordered_ = false;
}

void ShardedParameterStore::wait_uploads() {
  if (!uploads_unwaited_) return;
  uploads_->wait();
  uploads_unwaited_ = uploads_unordered_ = false;
}

void ShardedParameterStore::take_prefetch() {
  auto pending = std::move(prefetch_pending_);
  const bool upload = upload_pending_;
  prefetched_ = -1;
  upload_pending_ = false;
  if (pending) pending->wait();
  if (upload) order_kernels_after_uploads();  // the kernels from now on read the uploaded part
}

void ShardedParameterStore::discard_prefetch() {
  if (prefetched_ < 0) return;
  auto pending = std::move(prefetch_pending_);
  prefetched_ = -1;
  upload_pending_ = false;
  ++prefetch_misses_;
  // Its gather completes; its upload may run on: the next upload queues behind it, the next
  // kernel writing its buffer waits for it (start_prefetch), and so do writers of the host shard
  // (drop_prefetch).
  if (pending) pending->wait();
}

void ShardedParameterStore::drop_prefetch() {
  discard_prefetch();
  wait_uploads();  // the caller may write what an upload reads
  resident_ = -1;  // and the parameters param_work_[1] holds may change
}

const float* ShardedParameterStore::gather(int unit) {
  const core::ParamUnit& u = units()[unit];
  if (stage_ == 2) return params_.data() + u.begin;
  if (direct()) return shard_.data() + u.begin;
  take(unit, param_holder_, "gather");
  if (unit > 0) ++block_gathers_;
  if (unit > 0 && unit == resident_) {
    // Still in its buffer since it was last gathered (backward starting on the unit forward
    // ended on, a recomputed segment's last unit, the next micro-batch's first block): nothing
    // to gather or upload.
    ++reused_;
  } else if (unit > 0 && prefetched_ == unit) {  // gathered ahead: wait for it and swap it in
    take_prefetch();
    ++prefetch_hits_;
    std::swap(param_work_[1], prefetch_work_);
  } else {
    if (unit > 0) discard_prefetch();
    float* work = param_work_[slot(unit)].data();
    const std::size_t s = slice(unit);
    float* own = own_slice(unit, work);
    if (ranks_ > 1) dp_.all_gather({own, s}, {work, u.size()});
  }
  if (unit > 0) resident_ = unit;
  if (unit > 0 && prefetching()) {
    // The direction of travel: up past the last block unit gathered (forward), down below it
    // (backward), and the other way on the same unit again: backward starts on the unit forward
    // ended on, and the next forward (or a recomputed segment) on the one backward ended on.
    // The embeddings' unit 0 has its own buffer and is never prefetched.
    ascending_ = unit > last_block_ || (unit == last_block_ && !ascending_);
    int next = ascending_ ? unit + 1 : unit - 1;
    last_block_ = unit;
    if (planning_ && planned_[planned_at_] == unit) {
      // The caller's order (plan_gathers): the next other unit (this one asked again at once is
      // served from its buffer meanwhile), none after the last.
      ++planned_at_;
      std::size_t ahead = planned_at_;
      while (ahead < planned_.size() && planned_[ahead] == unit) ++ahead;
      next = ahead < planned_.size() ? planned_[ahead] : -1;
      if (planned_at_ == planned_.size()) {
        // Backward came down to here: the next forward, turning up on this unit (kept in its
        // buffer), prefetches the one above it.
        planning_ = false;
        ascending_ = false;
      }
      if (prefetched_ >= 0 && prefetched_ != next) discard_prefetch();
    } else {
      planning_ = false;  // out of the caller's order: guess from here on
    }
    if (prefetched_ < 0 && next >= 1 && next < int(units().size())) start_prefetch(next);
  }
  return param_work_[slot(unit)].data();
}

void ShardedParameterStore::plan_gathers(const int* units, std::size_t n) {
  planning_ = stage_ == 3 && prefetching() && n > 0;
  if (!planning_) return;
  planned_.assign(units, units + n);  // within the capacity reserved at construction
  planned_at_ = 0;
}

void ShardedParameterStore::release(int unit) {
  if (stage_ == 2 || direct()) return;
  if (param_holder_[slot(unit)] != unit) {
    throw std::logic_error("ZeRO store: release of unit " + std::to_string(unit) +
                           " that was not gathered");
  }
  param_holder_[slot(unit)] = -1;
}

float* ShardedParameterStore::begin_write(int unit) {
  const core::ParamUnit& u = units()[unit];
  if (stage_ == 2) return params_.data() + u.begin;
  if (direct()) return shard_.data() + u.begin;
  drop_prefetch();  // it read the values about to change
  take(unit, param_holder_, "write");
  return param_work_[slot(unit)].data();
}

void ShardedParameterStore::commit(int unit) {
  if (stage_ == 2 || direct()) return;
  drop_prefetch();
  const std::size_t s = slice(unit);
  shard_from(param_work_[slot(unit)].data() + rank_ * s, shard_offset(unit), s);
  release(unit);
}

float* ShardedParameterStore::gradients(int unit) {
  if (!has_gradients_) {
    throw std::logic_error("an inference parameter store holds no gradients (unit " +
                           std::to_string(unit) + " asked for them)");
  }
  if (ranks_ == 1) return grad_shard_.data() + units()[unit].begin;  // accumulate in place
  const int sl = slot(unit);
  if (grad_holder_[sl] == unit) return grad_work_[sl].data();  // open: accumulating on
  take(unit, grad_holder_, "gradients");
  Reduction& r = reducing_[sl];
  if (r.op && r.work == grad_work_[sl].data()) {
    if (sl == 1) {
      std::swap(grad_work_[1], grad_spare_);  // the other block buffer is free
    } else {
      finish_reduction(0);  // the embeddings' one buffer: its last reduction completes first
    }
  }
  if (reducing_[1 - sl].op) reducing_[1 - sl].op->test();  // MPI progresses when poked
  float* work = grad_work_[sl].data();
  k::fill(work, int64_t(units()[unit].size()), 0.0f);
  return work;
}

void ShardedParameterStore::finish_reduction(int sl) {
  Reduction& r = reducing_[sl];
  if (!r.op) return;
  r.op->wait();
  r.op.reset();
  const std::size_t s = slice(r.unit);
  // In place: this rank's reduced slice is in its own block of the work buffer (or its copy).
  float* shard = grad_shard_.data() + shard_offset(r.unit);
  if (r.wire != nullptr) {
    k::from_bf16(shard, r.wire + rank_ * s, int64_t(s), /*accumulate=*/true);
  } else {
    k::add(shard, r.work + rank_ * s, int64_t(s));
  }
  const Reduction done = std::move(r);
  r = Reduction{};
  // The listener orders its copies after the add (CopyQueue::follow_kernels), so the host need
  // not wait here for the kernels queued so far (the current unit's backward).
  if (done.final) final_listener_(done.unit, shard, final_pass_);
}

void ShardedParameterStore::finish_reductions() {
  finish_reduction(0);
  finish_reduction(1);
}

void ShardedParameterStore::gradients_done(int unit) {
  if (ranks_ == 1) {  // accumulated in the shard itself: final now in the final pass
    if (final_unit(unit)) final_listener_(unit, grad_shard_.data() + shard_offset(unit), true);
    return;
  }
  const int sl = slot(unit);
  if (grad_holder_[sl] != unit) {
    throw std::logic_error("ZeRO store: gradients_done of unit " + std::to_string(unit) +
                           " that was not opened");
  }
  grad_holder_[sl] = -1;
  // At most one reduction in flight per slot: the previous block's completes now, after this
  // block's backward ran beside it. A unit's slices are added in the order its reductions
  // started, so micro-batches accumulate in order.
  finish_reduction(sl);
  const std::size_t s = slice(unit), n = units()[unit].size();
  float* work = grad_work_[sl].data();
  if (grad_wire_[sl].size() > 0) {  // bf16 on the wire; the fp32 buffer is free again
    std::uint16_t* wire = grad_wire_[sl].data();
    k::to_bf16(wire, work, int64_t(n));  // the collective is ordered after it
    reducing_[sl] = Reduction{unit, final_unit(unit), nullptr, wire,
                              dp_.start_reduce_scatter_sum_bf16({wire, n})};
    return;
  }
  reducing_[sl] = Reduction{unit, final_unit(unit), work, nullptr,
                            dp_.start_reduce_scatter_sum({work, n}, {work + rank_ * s, s})};
}

std::vector<std::pair<float*, std::size_t>> ShardedParameterStore::gradient_pieces(
    std::size_t begin, std::size_t end) {
  if (!has_gradients_) return {};
  finish_reductions();
  std::vector<std::pair<float*, std::size_t>> pieces;
  std::size_t at = 0;  // where the slice starts in the shard
  for (const auto& [lo, hi] : owned_ranges()) {
    const std::size_t b = std::max(lo, begin), e = std::min(hi, end);
    if (b < e) pieces.emplace_back(grad_shard_.data() + at + (b - lo), e - b);
    at += hi - lo;
  }
  return pieces;
}

void ShardedParameterStore::zero_gradients() {
  finish_reductions();  // nothing in flight may add to the shard after it is cleared
  ++generation_;
  core::zero(grad_shard_.data(), grad_shard_.size());
}

void ShardedParameterStore::all_gather_params() {
  if (stage_ != 2 || ranks_ == 1) return;
  for (std::size_t u = 0; u < units().size(); ++u) {
    const std::size_t s = slice(int(u));
    float* whole = params_.data() + units()[u].begin;
    dp_.all_gather({whole + rank_ * s, s}, {whole, units()[u].size()});
  }
}

}  // namespace colossal::zero
