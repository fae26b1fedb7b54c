// A tensor group that is never asked to communicate: building a model (its tables, buffers and
// initial values) only needs the group's size and this rank's place in it. Any collective throws.
#pragma once

#include <cstddef>
#include <stdexcept>

#include "core/tensor_group.hpp"

namespace colossal::test {

class PretendGroup final : public core::TensorGroup {
 public:
  PretendGroup(int size, int rank) : size_(size), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float*, std::size_t) override { fail(); }
  void all_reduce_max(float*, std::size_t) override { fail(); }
  void all_gather(const float*, std::size_t, float*) override { fail(); }
  void reduce_scatter(const float*, std::size_t, float*) override { fail(); }
  void broadcast(float*, std::size_t, int) override { fail(); }
  void send_recv(const float*, std::size_t, int, float*, int) override { fail(); }

 private:
  [[noreturn]] static void fail() { throw std::logic_error("PretendGroup cannot communicate"); }
  int size_, rank_;
};

}  // namespace colossal::test
