// "Rank 0 checks, every rank learns": a step that only one rank may take (a file check, a
// directory made, a plan searched) whose outcome every rank must share, so that a failure there
// stops every rank alike instead of leaving the others waiting in their next collective.
#pragma once

#include <exception>
#include <string>

#include "parallel/communicator.hpp"

namespace colossal::apps {

// Rank `root` runs work(error), which returns its result text and may set `error` to a whole
// message; what it throws becomes `context` + what(). Every rank then receives the error and
// throws it as `Error`, or receives the result and returns it. Collective over `world`.
template <class Error, class Work>
std::string on_root(parallel::Communicator& world, const std::string& context, Work&& work,
                    int root = 0) {
  std::string result, error;
  if (world.rank() == root) {
    try {
      result = work(error);
    } catch (const std::exception& e) {
      error = context + e.what();
    }
  }
  world.broadcast_string(error, root);
  if (!error.empty()) throw Error(error);
  world.broadcast_string(result, root);
  return result;
}

}  // namespace colossal::apps
