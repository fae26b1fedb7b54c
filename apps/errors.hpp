// The errors of a run that every rank raises alike, shared by the trainers and the planner's
// automatic layout (apps/layout.cpp), which sits below the trainer.
#pragma once

#include <stdexcept>

namespace colossal::apps {

// An error that every rank raises alike (same data, same all-reduced loss), so every rank can
// report it and exit normally instead of aborting the job.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A data, model or checkpoint file that cannot be used as the config says (exit code 3, as
// io::DataError and io::H5Error), found alike on every rank.
class DataFileError : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

class NonFiniteError : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

}  // namespace colossal::apps
