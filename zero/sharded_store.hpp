// ZeRO stages 2 and 3 as a parameter store (core/parameter_store.hpp).
//
// Every parameter unit is padded to a multiple of dp*16 floats and split into dp equal slices;
// rank r owns slice r of every unit. Its shard is the concatenation of its slices in unit order,
// so unit u's slice starts at shard offset units[u].begin / dp and the shard holds flat/dp floats.
//
//   stage 2: parameters whole on every rank. Backward accumulates a unit's gradients into a
//            unit-sized work buffer; when the unit is done its reduce-scatter starts
//            (non-blocking) and backward goes on with the next unit in a second block buffer; the
//            reduction completes (and this rank's slice is added to the gradient shard) when its
//            buffer is needed again, when the next unit of its kind is done, or when anything
//            reads the gradient shard. Gradient memory is the shard plus three work buffers (the
//            embeddings', open through all of backward, and two for the other units), not the
//            whole model. After the update each unit is all-gathered in place.
//   stage 3: parameters sharded too. gather(u) all-gathers the unit into a work buffer (the
//            embeddings' or the one shared by the other units) and release(u) frees it for the
//            next unit. Each gather of a block unit also starts (non-blocking) the all-gather of
//            the unit expected next into a third buffer: u + 1 while units are gathered in
//            ascending order (forward), u - 1 in descending order (backward), the other way than
//            last time when u is the last unit gathered again (where backward starts). When that
//            unit is asked for, its buffer is swapped in after the gather completes; the unit
//            last gathered, asked again, is served from its buffer; any other unit is gathered
//            as before and the prefetch is dropped (core::Model's backward says its order
//            instead: plan_gathers). So parameter memory is the shard plus the
//            embeddings and two blocks. A prefetch or a kept unit never outlives the parameters
//            it read: param_shard(), host_param_shard(), begin_write() and commit() drop it
//            first.
//            With parameter offload the shard's last host_param_states() states live in host
//            memory (all of them at offload.params_fraction 1) and each gather first uploads
//            this rank's slice's part of them; the others stay in the device shard. The host
//            shard holds all of the shard's states: its first ones are the optimizer's host copy
//            of the device part (zero::ShardedAdamW refreshes them before its host update).
//            The unit expected next is prefetched then on one rank too: its host part is
//            uploaded on a copy queue of its own while the kernels of the unit in use run (after
//            those queued before, which may still read the buffer). The next unit's kernels wait
//            for that upload by an event; on several ranks the transport's gather waits for it
//            by an event (NCCL) or the host (MPI, which the host drives). So the uploads hide
//            behind compute (ZeRO-Infinity's prefetch).
// With one rank nothing is communicated: the shard is the flat buffer and gradients accumulate in
// it directly. Gradients are reduced on every micro-batch (traffic per step is the accumulation
// count times the gradient bytes), which is what frees the full gradient buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/memory.hpp"
#include "core/parameter_store.hpp"
#include "parallel/communicator.hpp"

namespace colossal::zero {

class ShardedParameterStore : public core::ParameterStore {
 public:
  // `offload_params` (stage 3): the share of the shard's states (its last ones,
  // core::offloaded_states) that live in host memory; 0: none. Without `gradients` (inference)
  // no gradient buffer is allocated and gradients() throws std::logic_error.
  ShardedParameterStore(std::vector<core::ParamUnit> units, std::size_t flat_size, int stage,
                        parallel::Communicator& dp, core::MemoryTracker& tracker,
                        double offload_params = 0.0, bool bf16_reduce = false,
                        bool gradients = true);

  const float* gather(int unit) override;
  void release(int unit) override;
  float* begin_write(int unit) override;
  void commit(int unit) override;
  float* gradients(int unit) override;
  void gradients_done(int unit) override;
  void zero_gradients() override;
  float* full_params() override { return stage_ == 2 ? params_.data() : nullptr; }
  bool keeps_whole() const override { return stage_ == 2; }
  std::vector<std::pair<float*, std::size_t>> gradient_pieces(std::size_t begin,
                                                              std::size_t end) override;
  bool collective() const override { return stage_ == 3 && ranks_ > 1; }
  // Stage 3, prefetching: the block units gathered next in this order (core::Model's backward).
  // Each gather of the next one prefetches the one after it; a unit asked out of this order
  // ends the plan (the direction of travel guesses again); after the last one nothing is
  // prefetched (the next forward turns up from it, or the step changes the parameters first).
  void plan_gathers(const int* units, std::size_t n) override;

  int stage() const { return stage_; }
  std::size_t shard_size() const { return flat_size() / ranks_; }
  // This rank's slice of every unit, as flat ranges in unit (= shard) order.
  std::vector<std::pair<std::size_t, std::size_t>> owned_ranges() const;
  // Completes the reductions in flight first, so the shard holds every finished unit.
  float* grad_shard() {
    finish_reductions();
    return grad_shard_.data();
  }
  // Completes every reduce-scatter in flight and adds its slice to the gradient shard.
  void finish_reductions();
  // Stage 3: the device's part of the parameter shard, its first shard_size() -
  // host_param_states() states (all of them without parameter offload). The caller may write
  // it: a prefetched unit is dropped first.
  float* param_shard() {
    drop_prefetch();
    return shard_.data();
  }
  // Stage 3 with parameter offload: the host shard, shard_size() states in state order, of which
  // the last host_param_states() are where those parameters live: writing them changes the
  // parameters. The first ones are only the optimizer's host copy of the device part (writing
  // them changes nothing until it copies them up). Null without parameter offload.
  float* host_param_shard() {
    drop_prefetch();
    return host_shard_.data();
  }
  bool params_offloaded() const { return offload_params_; }
  std::size_t host_param_states() const { return host_states_; }
  // Stage 2: all-gathers every unit in place from each rank's updated slice.
  void all_gather_params();

  // Final gradients (ZeRO-Offload's copies during backward). While the final pass is on (the
  // step's last micro-batch: zero::GradientSync::set_overlap), a unit in `units` (set_final_units;
  // none by default) whose reduction is started is final once it completes: as soon as its slice
  // is in the gradient shard (queued: the listener orders what reads it after the kernels that
  // add it, CopyQueue::follow_kernels, so the host does not wait for them), listener(unit, slice,
  // during_backward) is called with the slice's first element in the shard; during_backward is
  // false for the reductions still in flight when backward ended, completed later (by
  // grad_shard(): the last block's and the embeddings'). With one rank, when backward finishes
  // the unit. zero_gradients() starts a new generation: a listener's copies of an older one are
  // stale.
  using FinalListener = std::function<void(int unit, const float* slice, bool during_backward)>;
  void set_final_listener(FinalListener listener) { final_listener_ = std::move(listener); }
  void set_final_units(std::vector<bool> units) { final_units_ = std::move(units); }
  void set_final_pass(bool on) { final_pass_ = on; }
  uint64_t gradient_generation() const { return generation_; }
  // Unit `unit`'s slice: its first state in the shard, and its length.
  std::size_t slice_offset(int unit) const { return shard_offset(unit); }
  std::size_t slice_size(int unit) const { return slice(unit); }
  // Stage 3 with parameter offload: bytes copied from the host shard to the device by gathers.
  uint64_t uploaded_bytes() const { return uploaded_bytes_; }
  // Stage 3 on several ranks or with parameter offload: block-unit gathers served by a
  // prefetch, and prefetches dropped unused (a unit asked out of order, e.g. by a recomputed
  // segment, or parameters written).
  uint64_t prefetch_hits() const { return prefetch_hits_; }
  uint64_t prefetch_misses() const { return prefetch_misses_; }
  // Stage 3 (not one rank without offload): block-unit gathers served by the unit still in its
  // buffer from the gather before (nothing gathered or uploaded): backward's first unit, which
  // forward gathered last; a micro-batch's first block, which the backward before gathered last
  // (unless the parameters changed since: the step); a recomputed segment's last unit.
  uint64_t reused_gathers() const { return reused_; }
  // Stage 3 (not one rank without offload): gathers of units other than 0.
  uint64_t block_gathers() const { return block_gathers_; }

 private:
  std::size_t slice(int unit) const { return units()[unit].size() / ranks_; }
  std::size_t shard_offset(int unit) const { return units()[unit].begin / ranks_; }
  int slot(int unit) const { return unit == 0 ? 0 : 1; }
  // Direct addressing of the shard as the flat buffer (one rank, no offload).
  bool direct() const { return ranks_ == 1 && !offload_params_; }
  // Stage 3 gathers the block unit expected next ahead of use: on several ranks (the
  // all-gather), or with parameter offload (the upload).
  bool prefetching() const { return ranks_ > 1 || offload_params_; }
  // Of states [at, at + n) of the shard, how many (the first ones) live on the device.
  std::size_t on_device(std::size_t at, std::size_t n) const;
  void take(int unit, int holders[2], const char* what);
  // This rank's slice of `unit` into its block of `work` (uploaded when offloaded).
  float* own_slice(int unit, float* work);
  // Starts gathering `unit` into prefetch_work_ (stage 3, block units only, prefetching()).
  void start_prefetch(int unit);
  // The prefetched unit is put to use: its gather completes, and the kernels queued from now on
  // wait for its upload.
  void take_prefetch();
  // A prefetch not wanted (counted as a miss): its gather completes; its upload may run on.
  void discard_prefetch();
  // Before the parameters may change: discards the prefetch, waits for every upload on the host
  // and forgets the unit param_work_[1] holds.
  void drop_prefetch();
  // Kokkos' stream, or the host, waits for the uploads queued so far.
  void order_kernels_after_uploads();
  void wait_uploads();
  // Completes slot `slot`'s reduce-scatter in flight, if any, into the gradient shard.
  void finish_reduction(int slot);

  int stage_;
  parallel::Communicator& dp_;
  int ranks_, rank_;
  bool offload_params_;
  bool has_gradients_;
  core::DeviceArray<float> params_;         // stage 2: the whole flat buffer
  // Stage 3: this rank's parameter slices in state order: the first shard_size() - host_states_
  // on the device, the rest (parameter offload) in host_shard_ at the same state positions.
  core::DeviceArray<float> shard_, host_shard_;
  std::size_t host_states_ = 0;
  // Copies states [at, at + n) of the shard to (upload) or from a device buffer, each part from
  // where it lives.
  // With `queue`, the host part's upload is queued there (after the kernels queued so far)
  // instead of waited for. Returns whether anything was uploaded.
  bool shard_to(float* device, std::size_t at, std::size_t n, core::CopyQueue* queue = nullptr);
  void shard_from(const float* device, std::size_t at, std::size_t n);
  core::DeviceArray<float> param_work_[2];  // stage 3: gathered unit 0 | any other unit
  core::DeviceArray<float> prefetch_work_;  // stage 3, prefetching(): the block unit expected next
  int prefetched_ = -1;                     // the unit in prefetch_work_, -1: none
  std::unique_ptr<parallel::PendingCollective> prefetch_pending_;  // its gather (several ranks)
  std::unique_ptr<core::CopyQueue> uploads_;  // parameter offload: the prefetches' uploads
  bool upload_pending_ = false;     // the prefetch's upload is queued there
  bool uploads_unordered_ = false;  // an upload queued that Kokkos' stream does not wait for
  bool uploads_unwaited_ = false;   // an upload queued that the host has not waited for
  int resident_ = -1;  // the block unit param_work_[1] holds as gathered (-1: none or stale)
  uint64_t reused_ = 0, block_gathers_ = 0;
  int last_block_ = -1;                     // the last block unit gathered (direction of travel)
  bool ascending_ = true;                   // and the direction it was gathered in
  std::vector<int> planned_;                // plan_gathers' units (capacity kept between passes)
  std::size_t planned_at_ = 0;              // the next of them to be gathered
  bool planning_ = false;                   // a plan is being followed
  uint64_t prefetch_hits_ = 0, prefetch_misses_ = 0;
  core::DeviceArray<float> grad_shard_;     // this rank's reduced gradient slices
  core::DeviceArray<float> grad_work_[2];   // a unit's gradients before reduction
  core::DeviceArray<float> grad_spare_;     // slot 1's second buffer: a block accumulates here
                                            // while the previous one's reduction is in flight
  // parallel.grad_reduce: bf16: per slot, the bf16 copy of the unit in flight, which frees its
  // fp32 work buffer at once (no spare).
  core::DeviceArray<std::uint16_t> grad_wire_[2];
  struct Reduction {                        // a unit's reduce-scatter in flight
    int unit = -1;
    bool final = false;                     // started in the final pass: tell the listener
    float* work = nullptr;                  // fp32: the work buffer reduced in place
    std::uint16_t* wire = nullptr;          // bf16: its copy reduced in place instead
    std::unique_ptr<parallel::PendingCollective> op;
  };
  Reduction reducing_[2];                   // per slot
  int param_holder_[2] = {-1, -1}, grad_holder_[2] = {-1, -1};
  uint64_t uploaded_bytes_ = 0;
  FinalListener final_listener_;
  std::vector<bool> final_units_;
  bool final_pass_ = false;
  uint64_t generation_ = 0;
  bool final_unit(int unit) const {
    return final_pass_ && final_listener_ && std::size_t(unit) < final_units_.size() &&
           final_units_[std::size_t(unit)];
  }
};

}  // namespace colossal::zero
