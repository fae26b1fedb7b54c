#include "parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <tuple>

namespace colossal::parallel {
namespace {

PipelineSchedule schedule_named(std::string_view kind) {
  const std::optional<PipelineSchedule> parsed = parse_pipeline_schedule(kind);
  if (!parsed) {
    throw std::invalid_argument("unknown pipeline schedule '" + std::string(kind) +
                                "' (allowed: gpipe, 1f1b, interleaved)");
  }
  return *parsed;
}

}  // namespace

std::vector<PipelineAction> pipeline_schedule(std::string_view kind, int stages, int stage,
                                              int micro, int chunks) {
  return pipeline_schedule(schedule_named(kind), stages, stage, micro, chunks);
}

bool schedule_completes(std::string_view kind, int stages, int micro, int chunks) {
  return schedule_completes(schedule_named(kind), stages, micro, chunks);
}

namespace {

// The schedule, and for each action whether it is the backward of a steady-state pair of the
// interleaved schedule (exchanged with the forward before it: pipeline_exchanges).
std::vector<PipelineAction> make_schedule(PipelineSchedule kind, int stages, int stage, int micro,
                                          int chunks, std::vector<char>* paired) {
  if (stages < 1 || stage < 0 || stage >= stages || micro < 1 || chunks < 1) {
    throw std::invalid_argument("pipeline_schedule: stage " + std::to_string(stage) + " of " +
                                std::to_string(stages) + " with " + std::to_string(micro) +
                                " micro-batches");
  }
  std::vector<PipelineAction> actions;
  if (kind == PipelineSchedule::gpipe) {
    for (int i = 0; i < micro; ++i) actions.push_back({true, i});
    for (int i = 0; i < micro; ++i) actions.push_back({false, i});
    return actions;
  }
  if (kind == PipelineSchedule::interleaved) {
    if (micro % stages != 0) {
      throw std::invalid_argument("the interleaved schedule needs the micro-batch count (" +
                                  std::to_string(micro) + ") to be a multiple of the stages (" +
                                  std::to_string(stages) + ")");
    }
    // The k-th forward (backward) of this rank: chunk and micro-batch.
    const int total = micro * chunks;
    auto forward = [&](int k) {
      return PipelineAction{true, (k / (stages * chunks)) * stages + k % stages,
                            (k / stages) % chunks};
    };
    auto backward = [&](int k) {
      return PipelineAction{false, (k / (stages * chunks)) * stages + k % stages,
                            chunks - 1 - (k / stages) % chunks};
    };
    const int warmup = micro == stages
                           ? total
                           : std::min(total, (stages - stage - 1) * 2 + (chunks - 1) * stages);
    int f = 0, b = 0;
    for (; f < warmup; ++f) actions.push_back(forward(f));
    if (paired) paired->assign(actions.size(), 0);
    while (f < total) {
      actions.push_back(forward(f++));
      actions.push_back(backward(b++));
      if (paired) {
        paired->push_back(0);
        paired->push_back(1);
      }
    }
    while (b < total) actions.push_back(backward(b++));
    if (paired) paired->resize(actions.size(), 0);
    return actions;
  }
  // 1f1b
  const int warmup = std::min(stages - stage - 1, micro);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) actions.push_back({true, next_forward});
  while (next_forward < micro) {
    actions.push_back({true, next_forward++});
    actions.push_back({false, next_backward++});
  }
  while (next_backward < micro) actions.push_back({false, next_backward++});
  return actions;
}

}  // namespace

std::vector<PipelineAction> pipeline_schedule(PipelineSchedule kind, int stages, int stage,
                                              int micro, int chunks) {
  return make_schedule(kind, stages, stage, micro, chunks, nullptr);
}

std::vector<std::vector<PipelineMessage>> pipeline_exchanges(PipelineSchedule kind, int stages,
                                                             int stage, int micro, int chunks) {
  if (chunks != 1 && kind != PipelineSchedule::interleaved) {
    throw std::invalid_argument(std::string("pipeline_exchanges: ") + pipeline_schedule_name(kind) +
                                " runs one chunk per rank, not " + std::to_string(chunks));
  }
  std::vector<char> paired;
  const std::vector<PipelineAction> actions =
      make_schedule(kind, stages, stage, micro, chunks, &paired);
  paired.resize(actions.size(), 0);
  const int virtual_stages = stages * chunks;
  const int next = (stage + 1) % stages, previous = (stage + stages - 1) % stages;
  std::vector<std::vector<PipelineMessage>> groups(actions.size() + 1);
  std::vector<PipelineMessage> sends;  // of the actions since the last group
  std::size_t open = 0;                // the group the next receives join
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& a = actions[i];
    const int v = a.chunk * stages + stage;
    if (!paired[i]) {
      open = i;
      groups[open] = std::move(sends);
      sends.clear();
    }
    if (a.forward) {
      if (v > 0) groups[open].push_back({false, false, v - 1, a.micro, previous});
      if (v + 1 < virtual_stages) sends.push_back({true, false, v, a.micro, next});
    } else {
      if (v + 1 < virtual_stages) groups[open].push_back({false, true, v, a.micro, next});
      if (v > 0) sends.push_back({true, true, v - 1, a.micro, previous});
    }
  }
  groups.back() = std::move(sends);
  for (auto& group : groups) std::sort(group.begin(), group.end(), exchange_order);
  return groups;
}

bool exchange_order(const PipelineMessage& x, const PipelineMessage& y) {
  return std::tie(x.gradient, x.boundary, x.micro, x.send) <
         std::tie(y.gradient, y.boundary, y.micro, y.send);
}

bool exchanges_complete(PipelineSchedule kind, int stages, int micro, int chunks) {
  std::vector<std::vector<std::vector<PipelineMessage>>> groups;
  for (int r = 0; r < stages; ++r) {
    groups.push_back(pipeline_exchanges(kind, stages, r, micro, chunks));
  }
  return groups_complete(groups);
}

bool groups_complete(const std::vector<std::vector<std::vector<PipelineMessage>>>& by_rank) {
  const int stages = int(by_rank.size());
  for (const auto& rank_groups : by_rank) {
    for (const auto& group : rank_groups) {
      for (const PipelineMessage& m : group) {
        if (m.peer < 0 || m.peer >= stages) return false;
      }
    }
  }
  // Per rank its non-empty groups, each message with its place among the rank's messages to
  // (or from) that peer; posted[rank][peer][send]: those messages in issue order, with the
  // group that holds each.
  struct Posted {
    PipelineMessage message;
    int sequence;
  };
  struct InGroup {
    PipelineMessage message;
    std::size_t group;
  };
  std::vector<std::vector<std::vector<Posted>>> groups(stages);
  std::vector<std::vector<std::array<std::vector<InGroup>, 2>>> posted(
      stages, std::vector<std::array<std::vector<InGroup>, 2>>(stages));
  for (int r = 0; r < stages; ++r) {
    for (const auto& group : by_rank[std::size_t(r)]) {
      if (group.empty()) continue;
      groups[r].emplace_back();
      for (const PipelineMessage& m : group) {
        auto& issued = posted[r][m.peer][m.send];
        groups[r].back().push_back({m, int(issued.size())});
        issued.push_back({m, groups[r].size() - 1});
      }
    }
  }
  // Each send meets the receive of the same rank in the same place, for the same message.
  for (int r = 0; r < stages; ++r) {
    for (int q = 0; q < stages; ++q) {
      const auto& sent = posted[r][q][1];
      const auto& received = posted[q][r][0];
      if (sent.size() != received.size()) return false;
      for (std::size_t n = 0; n < sent.size(); ++n) {
        const PipelineMessage& a = sent[n].message;
        const PipelineMessage& b = received[n].message;
        if (a.gradient != b.gradient || a.boundary != b.boundary || a.micro != b.micro) return false;
      }
    }
  }
  std::vector<std::size_t> current(stages, 0);
  for (;;) {
    bool done = true, progress = false;
    std::vector<std::size_t> after = current;
    for (int r = 0; r < stages; ++r) {
      if (current[r] == groups[r].size()) continue;
      done = false;
      bool ready = true;
      for (const Posted& p : groups[r][current[r]]) {
        const int q = p.message.peer;
        // The counterpart: q's message of the other direction with r at the same sequence.
        if (posted[q][r][!p.message.send][std::size_t(p.sequence)].group > current[q]) {
          ready = false;
        }
      }
      if (ready) {
        ++after[r];
        progress = true;
      }
    }
    if (done) return true;
    if (!progress) return false;
    current = after;
  }
}

int peak_in_flight(const std::vector<PipelineAction>& actions) {
  std::vector<int> now, peak;
  for (const PipelineAction& a : actions) {
    if (a.chunk >= int(now.size())) {
      now.resize(a.chunk + 1, 0);
      peak.resize(a.chunk + 1, 0);
    }
    now[a.chunk] += a.forward ? 1 : -1;
    peak[a.chunk] = std::max(peak[a.chunk], now[a.chunk]);
  }
  return peak.empty() ? 0 : *std::max_element(peak.begin(), peak.end());
}

bool schedule_completes(PipelineSchedule kind, int stages, int micro, int chunks) {
  const int virtual_stages = stages * chunks;
  std::vector<std::vector<PipelineAction>> plans;
  for (int r = 0; r < stages; ++r) plans.push_back(pipeline_schedule(kind, stages, r, micro, chunks));
  // done_forward[v][i]: virtual stage v has sent micro-batch i's output; likewise backward.
  std::vector<std::vector<char>> done_forward(virtual_stages, std::vector<char>(micro, 0)),
      done_backward(virtual_stages, std::vector<char>(micro, 0));
  std::vector<std::size_t> next(stages, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < stages; ++r) {
      while (next[r] < plans[r].size()) {
        const PipelineAction& a = plans[r][next[r]];
        const int v = a.chunk * stages + r;
        const bool ready = a.forward
                               ? (v == 0 || done_forward[v - 1][a.micro])
                               : done_forward[v][a.micro] &&
                                     (v == virtual_stages - 1 || done_backward[v + 1][a.micro]);
        if (!ready) break;  // a blocking receive
        (a.forward ? done_forward : done_backward)[v][a.micro] = 1;
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < stages; ++r) {
    if (next[r] != plans[r].size()) return false;
  }
  return true;
}

}  // namespace colossal::parallel
