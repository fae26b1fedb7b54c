#include "checkpoint_sched/solvers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace colossal::checkpoint_sched {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string where(const char* who) { return std::string("checkpoint_sched::") + who + ": "; }

// Throws unless the chain is non-empty, made of whole blocks, and its times are finite and >= 0.
void check_chain(const Chain& chain, const char* who) {
  if (chain.ops.empty()) {
    throw std::invalid_argument(where(who) + "the chain has no ops (a schedule needs n >= 1); " +
                                "pass at least one op");
  }
  if (chain.ops_per_block < 1) {
    throw std::invalid_argument(where(who) + "ops_per_block is " +
                                std::to_string(chain.ops_per_block) +
                                " (a block has at least one op); set it to the ops per block");
  }
  const std::size_t opb = static_cast<std::size_t>(chain.ops_per_block);
  if (chain.ops.size() % opb != 0) {
    throw std::invalid_argument(where(who) + "the chain has " + std::to_string(chain.ops.size()) +
                                " ops, not a multiple of ops_per_block " + std::to_string(opb) +
                                " (the chain is made of whole blocks); fix ops or ops_per_block");
  }
  for (std::size_t j = 0; j < chain.ops.size(); ++j) {
    const ChainOp& op = chain.ops[j];
    for (double t : {op.forward_time, op.backward_time}) {
      if (!std::isfinite(t) || t < 0.0) {
        throw std::invalid_argument(where(who) + "op " + std::to_string(j) + " has a time of " +
                                    std::to_string(t) + " (times are durations: finite, >= 0); " +
                                    "fix the chain's forward_time / backward_time");
      }
    }
  }
}

// Copies of the stored activations (pipeline micro-batches in flight); the arena has one.
std::size_t multiplier(const Chain& chain) {
  return static_cast<std::size_t>(std::max(1, chain.stored_multiplier));
}

Schedule make_schedule(const Chain& chain, std::vector<Keep> keep) {
  Schedule s;
  s.cost = evaluate(chain, keep);
  s.keep = std::move(keep);
  return s;
}

// Prefix sums: q[j] = sum_{i<j} (x_i + a_i), p[j] = sum_{i<j} f_i, so that
// arena([s, e)) = a_s + q[e] - q[s+1] and the recompute time of [s, e) is p[e] - p[s].
struct Prefix {
  std::vector<std::size_t> q;
  std::vector<double> p;
  explicit Prefix(const Chain& chain) : q(chain.ops.size() + 1, 0), p(chain.ops.size() + 1, 0.0) {
    for (std::size_t j = 0; j < chain.ops.size(); ++j) {
      q[j + 1] = q[j] + chain.ops[j].input_bytes + chain.ops[j].saved_bytes;
      p[j + 1] = p[j] + chain.ops[j].forward_time;
    }
  }
  std::size_t arena(const Chain& chain, std::size_t s, std::size_t e) const {
    return chain.ops[s].saved_bytes + (q[e] - q[s + 1]);
  }
};

// Rounds a non-negative time comparison: times within tol of each other are a tie.
struct TimeOrder {
  double tol;
  // (t1, m1) is better than (t2, m2): less time, or the same time and less memory.
  template <class Mem>
  bool better(double t1, Mem m1, double t2, Mem m2) const {
    if (t1 < t2 - tol) return true;
    return t1 <= t2 + tol && m1 < m2;
  }
};

TimeOrder time_order(const Chain& chain) {
  double total = 0.0;
  for (const ChainOp& op : chain.ops) total += op.forward_time + op.backward_time;
  return TimeOrder{1e-12 * total};
}

// Rebuilds the keep vector from per-prefix choices: choice_at(e) == -1 means op e-1 is `all`
// (the previous prefix is e-1), otherwise it is the start s of a segment [s, e).
template <class ChoiceAt, class Step>
std::vector<Keep> rebuild(std::size_t n, ChoiceAt choice_at, Step step) {
  std::vector<Keep> keep(n, Keep::all);
  std::size_t e = n;
  while (e > 0) {
    const std::int32_t c = choice_at(e);
    if (c < 0) {
      keep[e - 1] = Keep::all;
      step(e, e - 1, true);
      e -= 1;
    } else {
      const std::size_t s = static_cast<std::size_t>(c);
      keep[s] = Keep::input;
      for (std::size_t j = s + 1; j < e; ++j) keep[j] = Keep::none;
      step(e, s, false);
      e = s;
    }
  }
  return keep;
}

}  // namespace

Cost evaluate(const Chain& chain, const std::vector<Keep>& keep) {
  const std::size_t n = chain.ops.size();
  if (keep.size() != n) {
    throw std::invalid_argument(where("evaluate") + "the schedule has " +
                                std::to_string(keep.size()) + " entries for a chain of " +
                                std::to_string(n) + " ops (one Keep per op); " +
                                "pass a schedule of the chain's length");
  }
  Cost cost;
  const std::size_t k = multiplier(chain);
  double base = 0.0;
  std::size_t segment = 0;  // arena of the open segment
  bool open = false;
  auto close = [&] {
    if (open) cost.arena = std::max(cost.arena, segment);
    open = false;
  };
  for (std::size_t j = 0; j < n; ++j) {
    const ChainOp& op = chain.ops[j];
    base += op.forward_time + op.backward_time;
    switch (keep[j]) {
      case Keep::all:
        close();
        cost.stored += k * (op.input_bytes + op.saved_bytes);
        break;
      case Keep::input:
        close();
        cost.stored += k * op.input_bytes;
        segment = op.saved_bytes;
        open = true;
        cost.recompute_time += op.forward_time;
        break;
      case Keep::none:
        if (!open) {
          throw std::invalid_argument(
              where("evaluate") + "op " + std::to_string(j) + " is Keep::none " +
              (j == 0 ? std::string("at the start of the chain")
                      : std::string("after a Keep::all op")) +
              " (a dropped op continues a segment begun by an earlier Keep::input op); " +
              "make op " + std::to_string(j) + " Keep::input or Keep::all");
        }
        segment += op.input_bytes + op.saved_bytes;
        cost.recompute_time += op.forward_time;
        break;
      default:
        throw std::invalid_argument(where("evaluate") + "op " + std::to_string(j) +
                                    " has Keep value " +
                                    std::to_string(static_cast<int>(keep[j])) +
                                    " (only all, input, none exist); pass a valid Keep");
    }
  }
  close();
  cost.memory = cost.stored + cost.arena;
  cost.time = base + cost.recompute_time;
  return cost;
}

Schedule solve_none(const Chain& chain) {
  check_chain(chain, "solve_none");
  return make_schedule(chain, std::vector<Keep>(chain.ops.size(), Keep::all));
}

Schedule solve_every_k(const Chain& chain, int k) {
  check_chain(chain, "solve_every_k");
  if (k < 1) {
    throw std::invalid_argument(where("solve_every_k") + "k is " + std::to_string(k) +
                                " (a segment spans at least one block); pass k >= 1");
  }
  const std::size_t opb = static_cast<std::size_t>(chain.ops_per_block);
  const std::size_t span = opb * static_cast<std::size_t>(k);  // ops per segment
  std::vector<Keep> keep(chain.ops.size(), Keep::none);
  for (std::size_t j = 0; j < keep.size(); j += span) keep[j] = Keep::input;
  return make_schedule(chain, std::move(keep));
}

Schedule solve_full(const Chain& chain) {
  check_chain(chain, "solve_full");
  return solve_every_k(chain, 1);
}

Schedule solve_sqrt(const Chain& chain) {
  check_chain(chain, "solve_sqrt");
  const std::size_t blocks = chain.ops.size() / static_cast<std::size_t>(chain.ops_per_block);
  std::size_t k = 1;  // ceil(sqrt(blocks)), in integers
  while (k * k < blocks) ++k;
  return solve_every_k(chain, static_cast<int>(k));
}

// Exact minimum memory. For each candidate arena cap c (0 and every distinct arena([s, e))), in
// increasing order, a prefix DP finds the lexicographically least (stored, recompute time) over
// schedules whose segments all have arena <= c:
//   best[e] = min( best[e-1] + (x_{e-1} + a_{e-1}, 0),                       op e-1 `all`
//                  min_{s in window(e)} best[s] + (x_s, p[e] - p[s]) )       segment [s, e)
// where window(e) = {s < e : arena([s, e)) <= c} is a contiguous range whose left end only moves
// right as e grows (arena([s, e)) grows in e and shrinks in s), so a monotone deque keeps its
// minimum. memory <= best[n].stored + c, with equality at the cap equal to the optimum's own arena,
// so min over c of best[n].stored + c is the minimum memory. Caps above the best total are skipped.
Schedule solve_min_memory(const Chain& chain) {
  check_chain(chain, "solve_min_memory");
  const std::size_t n = chain.ops.size();
  const Prefix pre(chain);
  const TimeOrder order = time_order(chain);
  const std::size_t k = multiplier(chain);

  std::vector<std::size_t> caps{0};
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t e = s + 1; e <= n; ++e) caps.push_back(pre.arena(chain, s, e));
  }
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());

  struct Val {
    std::size_t stored;
    double time;
  };
  auto less = [](const Val& a, const Val& b) {
    return a.stored < b.stored || (a.stored == b.stored && a.time < b.time);
  };
  std::vector<Val> best(n + 1);
  std::vector<std::int32_t> choice(n + 1), emax(n);
  std::vector<std::int32_t> dq(n);
  std::vector<Val> dq_key(n);

  std::size_t best_mem = std::numeric_limits<std::size_t>::max();
  double best_time = kInf;
  std::vector<Keep> best_keep;
  for (std::size_t c : caps) {
    if (c > best_mem) break;  // memory >= arena cap
    // emax[s] = the largest e with arena([s, e)) <= c, or s when op s alone does not fit.
    std::size_t e_cur = 0;
    for (std::size_t s = 0; s < n; ++s) {
      e_cur = std::max(e_cur, s);
      while (e_cur < n && pre.arena(chain, s, e_cur + 1) <= c) ++e_cur;
      emax[s] = static_cast<std::int32_t>(e_cur);
    }
    best[0] = Val{0, 0.0};
    std::size_t head = 0, tail = 0;
    for (std::size_t e = 1; e <= n; ++e) {
      const std::size_t j = e - 1;
      const ChainOp& op = chain.ops[j];
      best[e] = Val{best[j].stored + k * (op.input_bytes + op.saved_bytes), best[j].time};
      choice[e] = -1;
      if (static_cast<std::size_t>(emax[j]) >= e) {
        const Val key{best[j].stored + k * op.input_bytes, best[j].time - pre.p[j]};
        while (tail > head && !less(dq_key[tail - 1], key)) --tail;
        dq[tail] = static_cast<std::int32_t>(j);
        dq_key[tail] = key;
        ++tail;
      }
      while (head < tail && static_cast<std::size_t>(emax[dq[head]]) < e) ++head;
      if (head < tail) {
        const Val cand{dq_key[head].stored, dq_key[head].time + pre.p[e]};
        if (less(cand, best[e])) {
          best[e] = cand;
          choice[e] = dq[head];
        }
      }
    }
    const std::size_t total = best[n].stored + c;
    if (total < best_mem || (total == best_mem && order.better(best[n].time, 0, best_time, 0))) {
      best_mem = total;
      best_time = best[n].time;
      best_keep = rebuild(n, [&](std::size_t e) { return choice[e]; },
                          [](std::size_t, std::size_t, bool) {});
    }
  }
  return make_schedule(chain, std::move(best_keep));
}

// Rotor-style DP under a budget. Unit u = max(1, ceil(budget / memory_slots)) bytes; every size is
// rounded up to units, U(v) = ceil(v / u), and the budget down, B = floor(budget / u), so a
// schedule within B units is within the budget. For each candidate arena cap c (0 and every
// distinct U(arena([s, e))) <= B) a prefix DP over stored units m in [0, B - c]:
//   best[e][m] = min( best[e-1][m - U(x_{e-1} + a_{e-1})],                      op e-1 `all`
//                     min_{s in window(e)} best[s][m - U(x_s)] + p[e] - p[s] )   segment [s, e)
// with window(e) = {s < e : U(arena([s, e))) <= c}, contiguous with a left end that only moves
// right, so for each m a monotone deque over s of best[s][m - U(x_s)] - p[s] gives the minimum in
// amortised O(1): O(n * (B - c)) per cap. The answer is the least best[n][m] over caps and m (ties:
// least m + c units); back-pointers rebuild it.
Schedule solve_rotor(const Chain& chain, std::size_t budget_bytes, int memory_slots) {
  check_chain(chain, "solve_rotor");
  if (memory_slots < 1) {
    throw std::invalid_argument(where("solve_rotor") + "memory_slots is " +
                                std::to_string(memory_slots) +
                                " (memory is discretised into that many units); pass >= 1");
  }
  const std::size_t n = chain.ops.size();
  const TimeOrder order = time_order(chain);

  // Keeping everything is the least time there is; when every forward costs something it is the
  // unique least-time schedule, so it is the answer whenever it fits.
  Schedule none = solve_none(chain);
  const bool fits_none = none.cost.memory <= budget_bytes;
  const bool forwards_cost = std::all_of(chain.ops.begin(), chain.ops.end(),
                                         [](const ChainOp& op) { return op.forward_time > 0.0; });
  if (fits_none && forwards_cost) return none;

  const std::size_t slots = static_cast<std::size_t>(memory_slots);
  const std::size_t unit = std::max<std::size_t>(1, budget_bytes / slots +
                                                        (budget_bytes % slots != 0 ? 1 : 0));
  auto units = [unit](std::size_t v) { return v / unit + (v % unit != 0 ? 1 : 0); };
  const std::size_t B = budget_bytes / unit;
  const Prefix pre(chain);
  std::vector<std::size_t> S(n), X(n);  // U(x_j + a_j), U(x_j)
  for (std::size_t j = 0; j < n; ++j) {
    S[j] = units(multiplier(chain) * (chain.ops[j].input_bytes + chain.ops[j].saved_bytes));
    X[j] = units(multiplier(chain) * chain.ops[j].input_bytes);
  }
  // Candidate caps: arena grows with e, so stop extending a segment once it exceeds B.
  std::vector<char> is_cap(B + 1, 0);
  is_cap[0] = 1;
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t e = s + 1; e <= n; ++e) {
      const std::size_t a = units(pre.arena(chain, s, e));
      if (a > B) break;
      is_cap[a] = 1;
    }
  }

  const std::size_t width_max = B + 1;
  std::vector<double> best((n + 1) * width_max);
  std::vector<std::int32_t> choice((n + 1) * width_max), best_choice;
  std::vector<std::int32_t> dq(width_max * n);
  std::vector<double> dq_val(width_max * n);
  std::vector<std::int32_t> head(width_max), tail(width_max), emax(n);

  bool found = false;
  double win_time = kInf;
  std::size_t win_units = 0, win_width = 0, win_m = 0;
  for (std::size_t c = 0; c <= B; ++c) {
    if (!is_cap[c]) continue;
    const std::size_t W = B - c + 1;  // stored units 0 .. B - c
    std::size_t e_cur = 0;
    for (std::size_t s = 0; s < n; ++s) {
      e_cur = std::max(e_cur, s);
      while (e_cur < n && units(pre.arena(chain, s, e_cur + 1)) <= c) ++e_cur;
      emax[s] = static_cast<std::int32_t>(e_cur);
    }
    std::fill(best.begin(), best.begin() + (n + 1) * W, kInf);
    std::fill(head.begin(), head.begin() + W, 0);
    std::fill(tail.begin(), tail.begin() + W, 0);
    best[0] = 0.0;
    std::size_t lo = 0;
    for (std::size_t e = 1; e <= n; ++e) {
      const std::size_t j = e - 1;
      const double* row_j = best.data() + j * W;
      double* row_e = best.data() + e * W;
      std::int32_t* ch_e = choice.data() + e * W;
      for (std::size_t m = S[j]; m < W; ++m) {  // op j `all`
        row_e[m] = row_j[m - S[j]];
        ch_e[m] = -1;
      }
      if (static_cast<std::size_t>(emax[j]) >= e) {  // a segment may start at j: enqueue it
        const double pj = pre.p[j];
        for (std::size_t m = X[j]; m < W; ++m) {
          const double v = row_j[m - X[j]];
          if (v == kInf) continue;
          const double key = v - pj;
          std::int32_t* q = dq.data() + m * n;
          double* qv = dq_val.data() + m * n;
          std::int32_t t = tail[m];
          while (t > head[m] && qv[t - 1] >= key) --t;
          q[t] = static_cast<std::int32_t>(j);
          qv[t] = key;
          tail[m] = t + 1;
        }
      }
      // window(e) starts at lo = the least s with emax[s] >= e; it only moves right.
      while (lo < e && static_cast<std::size_t>(emax[lo]) < e) ++lo;
      const std::int32_t lo32 = static_cast<std::int32_t>(lo);
      const double pe = pre.p[e];
      for (std::size_t m = 0; m < W; ++m) {  // best segment ending at e
        const std::int32_t* q = dq.data() + m * n;
        std::int32_t h = head[m];
        const std::int32_t t = tail[m];
        while (h < t && q[h] < lo32) ++h;
        head[m] = h;
        if (h < t) {
          const double cand = dq_val[m * n + h] + pe;
          if (cand < row_e[m]) {
            row_e[m] = cand;
            ch_e[m] = q[h];
          }
        }
      }
    }
    const double* row_n = best.data() + n * W;
    bool improved = false;
    for (std::size_t m = 0; m < W; ++m) {
      if (row_n[m] == kInf) continue;
      if (!found || order.better(row_n[m], m + c, win_time, win_units)) {
        found = true;
        improved = true;
        win_time = row_n[m];
        win_units = m + c;
        win_width = W;
        win_m = m;
      }
    }
    if (improved) best_choice.assign(choice.begin(), choice.begin() + (n + 1) * W);
  }

  Schedule result;
  if (found) {
    std::size_t m = win_m;
    std::vector<Keep> keep = rebuild(
        n, [&](std::size_t e) { return best_choice[e * win_width + m]; },
        [&](std::size_t, std::size_t prev, bool all) { m -= all ? S[prev] : X[prev]; });
    result = make_schedule(chain, std::move(keep));
    if (result.cost.memory > budget_bytes) {
      throw std::logic_error(where("solve_rotor") + "the schedule uses " +
                             std::to_string(result.cost.memory) + " bytes over the budget " +
                             std::to_string(budget_bytes) + " (rounding up should prevent it); " +
                             "report this as a bug");
    }
    // With f_j == 0 somewhere, keeping everything may tie or beat a coarse discretisation.
    if (fits_none && order.better(none.cost.time, none.cost.memory, result.cost.time,
                                  result.cost.memory)) {
      return none;
    }
    return result;
  }
  if (fits_none) return none;
  // Nothing fits in whole units: the exact minimum may still fit (coarse units), else infeasible.
  result = solve_min_memory(chain);
  result.feasible = result.cost.memory <= budget_bytes;
  return result;
}

namespace {

[[noreturn]] void no_solver(std::string_view policy) {
  throw std::invalid_argument(where("solve") + "unknown policy '" + std::string(policy) +
                              "' (no solver has that name); use one of none, full, every_k, " +
                              "sqrt, rotor");
}

}  // namespace

Schedule solve(core::CheckpointPolicy policy, const Chain& chain, std::size_t budget_bytes,
               int every_k, int memory_slots) {
  using core::CheckpointPolicy;
  switch (policy) {
    case CheckpointPolicy::none: return solve_none(chain);
    case CheckpointPolicy::full: return solve_full(chain);
    case CheckpointPolicy::every_k: return solve_every_k(chain, every_k);
    case CheckpointPolicy::sqrt: return solve_sqrt(chain);
    case CheckpointPolicy::rotor: return solve_rotor(chain, budget_bytes, memory_slots);
    case CheckpointPolicy::selective:
    case CheckpointPolicy::manual: break;
  }
  no_solver(core::checkpoint_policy_name(policy));
}

Schedule solve(std::string_view policy, const Chain& chain, std::size_t budget_bytes,
               int every_k, int memory_slots) {
  const std::optional<core::CheckpointPolicy> parsed = core::parse_checkpoint_policy(policy);
  if (!parsed) no_solver(policy);
  return solve(*parsed, chain, budget_bytes, every_k, memory_slots);
}

std::string describe(const std::vector<Keep>& keep, int ops_per_block) {
  if (ops_per_block < 1) {
    throw std::invalid_argument(where("describe") + "ops_per_block is " +
                                std::to_string(ops_per_block) +
                                " (a block has at least one op); pass >= 1");
  }
  std::string out;
  out.reserve(keep.size() + keep.size() / static_cast<std::size_t>(ops_per_block));
  for (std::size_t j = 0; j < keep.size(); ++j) {
    if (j > 0 && j % static_cast<std::size_t>(ops_per_block) == 0) out += '|';
    switch (keep[j]) {
      case Keep::all: out += 'A'; break;
      case Keep::input: out += 'I'; break;
      case Keep::none: out += '.'; break;
      default: out += '?'; break;
    }
  }
  return out;
}

}  // namespace colossal::checkpoint_sched
