// Rank 0's control plane at scale, by simulation: the real Coordinator (and
// the real message codec) driven by N simulated ranks in one process, with no
// MPI and no TensorFlow.
//
// Every simulated step, every rank submits the same T allreduce tensors. Step
// 0 is the warm-up: requests carry name and metadata, and the coordinator
// announces an id per tensor. Later steps send ids only (the response cache).
// The timed part of a step is what rank 0's engine thread does for the
// control plane: Submit() of its own list, Parse() + Submit() of the
// serialized RequestList of each of the other N-1 ranks, Plan(), and
// Serialize() of each non-empty ResponseList (sent once to every worker).
// Building the workers' requests is their own work and is not timed.
//
// Checks, every step of every scenario (exit status 1 if one fails): every
// tensor is planned exactly once, with its element count, op, dtype and all N
// ranks as contributors; fused responses respect the fusion threshold and are
// greedy (the next tensor did not fit); nothing is left pending. The
// scenarios vary the order of submission and split it over several calls and
// Plan()s within a step; their plans must equal the in-order plan (exactly
// where rank 0 submits in the canonical order, else as sets of fused groups,
// when the in-order plan fuses everything into one response).
//
// Output: one JSON object per N on stdout; failures on stderr.
//   coordinator_sim [--ranks 8,16,...] [--steps 50] [--tensors 200]
//                   [--check-steps 5] [--fusion-bytes B] [--seed S]
//                   [--tensor-limit B]  (KERASDIST_FUSION_TENSOR_LIMIT; the
//                   default 0 fuses every tensor, the most planning work)
//                   [--drop-one 1]  (a fault, to show that the checks fail:
//                   the last rank leaves one tensor out of one step)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <ctime>
#include <unordered_map>
#include <vector>

#include "coordinator/coordinator.h"
#include "wire/message.h"
#include "transport/transport.h"  // NowMicros

using namespace kerasdist;

namespace {

struct Tensor {
  std::string name;
  TensorMeta meta;
  int64_t bytes = 0;
};

// A convolutional network's gradients: kernel and bias per layer, channel
// widths growing with depth (16 to 256). At 200 tensors that is 61 MB of
// float32, so the default 64 MiB fusion buffer takes all of them at once.
std::vector<Tensor> MakeModel(int n) {
  std::vector<Tensor> out(n);
  int64_t cin = 3;
  for (int i = 0; i < n; ++i) {
    const int layer = i / 2;
    const int64_t cout = 16 << std::min(4, layer * 5 / std::max(1, n / 2));
    Tensor& t = out[i];
    t.meta.type = OpType::kAllreduce;
    t.meta.dtype = DataType::kFloat32;
    t.meta.reduce_op = ReduceOp::kAverage;
    if (i % 2 == 0) {
      t.meta.shape = {3, 3, cin, cout};
      t.name = "DistributedAdam_Allreduce/grad_conv2d_" + std::to_string(layer) + "/kernel_0";
    } else {
      t.meta.shape = {cout};
      t.name = "DistributedAdam_Allreduce/grad_conv2d_" + std::to_string(layer) + "/bias_0";
      cin = cout;
    }
    t.bytes = NumElements(t.meta.shape) * 4;
  }
  return out;
}

// One call of one rank: the tensors it submits, in order.
struct Call {
  int rank;
  std::vector<int> tensors;
};
using Round = std::vector<Call>;  // calls that arrive before one Plan()

struct Scenario {
  const char* name;
  bool canonical;  // rank 0 sees tensors first in index order: exact plan
  bool frozen;     // Plan() clock frozen per step: all within one cycle time
};

const Scenario kScenarios[] = {
    {"inorder", true, false},   // every rank 0..T-1 in one call (timed)
    {"reversed", true, false},  // odd ranks submit in reverse order
    {"split", true, true},      // half the ranks: first T/2, Plan(), the rest
    {"shuffled", false, true},  // own order per rank, 1-4 calls, rounds mixed
};

std::vector<Round> MakeRounds(const Scenario& s, int n, int t, std::mt19937* rng) {
  std::vector<int> all(t);
  std::iota(all.begin(), all.end(), 0);
  std::vector<Round> rounds(1);
  const std::string name = s.name;
  if (name == "inorder") {
    for (int r = 0; r < n; ++r) rounds[0].push_back({r, all});
  } else if (name == "reversed") {
    for (int r = 0; r < n; ++r) {
      rounds[0].push_back({r, all});
      if (r % 2) std::reverse(rounds[0].back().tensors.begin(), rounds[0].back().tensors.end());
    }
  } else if (name == "split") {
    rounds.resize(2);
    const std::vector<int> first(all.begin(), all.begin() + t / 2);
    const std::vector<int> rest(all.begin() + t / 2, all.end());
    for (int r = 0; r < n; ++r) {
      if (r < n / 2) {
        rounds[0].push_back({r, first});
        rounds[1].push_back({r, rest});
      } else {
        rounds[0].push_back({r, all});
      }
    }
  } else {  // shuffled
    rounds.resize(4);
    for (int r = 0; r < n; ++r) {
      std::vector<int> order = all;
      std::shuffle(order.begin(), order.end(), *rng);
      const int calls = 1 + static_cast<int>((*rng)() % 4);
      std::vector<size_t> cuts = {0, order.size()};
      for (int c = 1; c < calls; ++c) cuts.push_back((*rng)() % (order.size() + 1));
      std::sort(cuts.begin(), cuts.end());
      for (int c = 0; c < calls; ++c)
        rounds[c].push_back({r, std::vector<int>(order.begin() + cuts[c],
                                                 order.begin() + cuts[c + 1])});
    }
    for (Round& round : rounds) std::shuffle(round.begin(), round.end(), *rng);
  }
  return rounds;
}

// This thread's CPU time: steadier than wall time on a shared machine, as it
// leaves out the time other processes held the core.
double CpuMicros() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

// A plan as tensor indices: one vector per response, in emission order.
using Groups = std::vector<std::vector<int>>;

struct StepResult {
  double total_us = 0, submit_us = 0, plan_us = 0, serialize_us = 0;
  double cpu_us = 0;    // CPU time of the same work
  double parse_us = 0;  // Parse() (and freeing) of the workers' lists alone
  int64_t bytes_received = 0, bytes_sent = 0;
  Groups groups;
};

class Sim {
 public:
  Sim(int n, int t, int64_t fusion_bytes, int64_t tensor_limit)
      : n_(n), model_(MakeModel(t)), seen_(0), limit_(tensor_limit) {
    CoordinatorOptions o;
    if (fusion_bytes > 0) o.fusion_threshold_bytes = fusion_bytes;
    o.fusion_tensor_limit_bytes = tensor_limit;
    fusion_bytes_ = o.fusion_threshold_bytes;
    coord_.reset(new Coordinator(n, o));
    ids_.assign(t, -1);
    for (int i = 0; i < t; ++i) by_name_[model_[i].name] = i;
  }

  std::vector<std::string> errors;
  bool drop_one = false;  // the fault: see --drop-one

  int64_t fusion_bytes() const { return fusion_bytes_; }

  // Runs one step (all rounds) and checks what it planned.
  StepResult Step(const std::vector<Round>& rounds, bool frozen, const std::string& what) {
    StepResult res;
    const int64_t frozen_us = NowMicros();
    std::vector<std::string> wires;
    for (const Round& round : rounds) {
      wires.clear();
      std::vector<RequestList> own;  // rank 0's, submitted as the engine does
      for (const Call& c : round) {
        RequestList list;
        list.seen = seen_;
        for (int i : c.tensors) {
          if (drop_one && c.rank == n_ - 1 && ids_[i] >= 0) {
            drop_one = false;
            continue;
          }
          if (ids_[i] >= 0) {
            list.AddId(ids_[i]);
          } else {
            list.AddNamed(model_[i].name, model_[i].meta);
          }
        }
        wires.push_back(c.rank == 0 ? std::string() : Serialize(list));
        if (c.rank == 0) own.push_back(std::move(list));
        res.bytes_received += wires.back().size();
      }
      // --- timed: rank 0's control plane for this round ---
      const double c0 = CpuMicros();
      const int64_t t0 = NowMicros();
      size_t k = 0;
      for (size_t i = 0; i < round.size(); ++i) {
        if (round[i].rank == 0) {
          coord_->Submit(0, own[k++]);
          continue;
        }
        if (!Parse(wires[i], &theirs_)) {  // reused, as the engine does
          errors.push_back(what + ": Parse() rejected rank " + std::to_string(round[i].rank));
          return res;
        }
        coord_->Submit(round[i].rank, theirs_);
      }
      const int64_t t1 = NowMicros();
      ResponseList plan = coord_->Plan(frozen ? frozen_us : NowMicros());
      const int64_t t2 = NowMicros();
      std::string out;
      if (!plan.empty()) out = Serialize(plan);
      const int64_t t3 = NowMicros();
      const double c1 = CpuMicros();
      // --- end timed ---
      res.cpu_us += c1 - c0;
      const int64_t p0 = NowMicros();
      for (size_t i = 0; i < round.size(); ++i) {
        if (round[i].rank == 0) continue;
        Parse(wires[i], &theirs_);
      }
      res.parse_us += NowMicros() - p0;
      res.submit_us += t1 - t0;
      res.plan_us += t2 - t1;
      res.serialize_us += t3 - t2;
      res.total_us += t3 - t0;
      if (plan.empty()) continue;
      res.bytes_sent += static_cast<int64_t>(out.size()) * (n_ - 1);
      ResponseList got;
      if (!Parse(out, &got)) {
        errors.push_back(what + ": the ResponseList does not parse back");
        return res;
      }
      Apply(got, &res, what);
    }
    if (coord_->HasPending())
      errors.push_back(what + ": tensors still pending after the step");
    Check(res, what);
    return res;
  }

 private:
  // What every simulated rank does with a response list: learn the ids.
  void Apply(const ResponseList& plan, StepResult* res, const std::string& what) {
    ++seen_;
    if (plan.abort || plan.shutdown)
      errors.push_back(what + ": abort/shutdown: " + plan.message);
    for (const auto& p : plan.new_ids) {
      auto it = by_name_.find(p.second);
      if (it == by_name_.end()) {
        errors.push_back(what + ": announced unknown name " + p.second);
        continue;
      }
      ids_[it->second] = p.first;
      if (static_cast<size_t>(p.first) >= id_to_tensor_.size()) id_to_tensor_.resize(p.first + 1, -1);
      id_to_tensor_[p.first] = it->second;
    }
    for (int32_t id : plan.evicted) {
      for (int32_t& x : ids_)
        if (x == id) x = -1;
    }
    // Greedy fusion within this list: one group per run of tensors that fit.
    int64_t open_bytes = -1;
    for (const Response& r : plan.responses) {
      std::vector<int> g;
      int64_t bytes = 0;
      bool ok = r.type == OpType::kAllreduce && r.error.empty() && r.contributors == n_ &&
                r.dtype == DataType::kFloat32 && r.reduce_op == ReduceOp::kAverage &&
                r.ids.size() == r.counts.size();
      for (size_t i = 0; ok && i < r.ids.size(); ++i) {
        const int32_t id = r.ids[i];
        const int t = id >= 0 && static_cast<size_t>(id) < id_to_tensor_.size()
                          ? id_to_tensor_[id] : -1;
        if (t < 0 || r.counts[i] != NumElements(model_[t].meta.shape)) {
          ok = false;
          break;
        }
        g.push_back(t);
        bytes += model_[t].bytes;
      }
      if (!ok) {
        errors.push_back(what + ": malformed response (type " + OpTypeName(r.type) +
                         ", contributors " + std::to_string(r.contributors) + ", error '" +
                         r.error + "')");
        continue;
      }
      if (bytes > fusion_bytes_ && g.size() > 1)
        errors.push_back(what + ": fused response of " + std::to_string(bytes) +
                         " bytes exceeds the fusion threshold");
      bool has_alone = false;
      for (int t : g) has_alone |= Alone(t);
      if (has_alone) {  // planned alone, and no fusion group closed by it
        if (g.size() > 1)
          errors.push_back(what + ": a tensor at the fusion tensor limit was fused");
        res->groups.push_back(std::move(g));
        continue;
      }
      if (open_bytes >= 0 && open_bytes + model_[g[0]].bytes <= fusion_bytes_)
        errors.push_back(what + ": a response starts with a tensor that fit the previous one");
      open_bytes = bytes;
      res->groups.push_back(std::move(g));
    }
  }

  void Check(const StepResult& res, const std::string& what) {
    std::vector<int> times(model_.size(), 0);
    for (const auto& g : res.groups)
      for (int t : g) ++times[t];
    for (size_t t = 0; t < times.size(); ++t) {
      if (times[t] != 1) {
        errors.push_back(what + ": tensor " + model_[t].name + " planned " +
                         std::to_string(times[t]) + " times");
        return;
      }
    }
  }

  int n_;
  std::vector<Tensor> model_;
  std::unordered_map<std::string, int> by_name_;
  std::vector<int32_t> ids_;           // tensor -> id (every rank learns the same)
  std::vector<int> id_to_tensor_;
  uint64_t seen_;
  int64_t fusion_bytes_ = 0;
  int64_t limit_ = 0;
  std::unique_ptr<Coordinator> coord_;
  RequestList theirs_;  // a worker's list, decoded into the same object each time

  bool Alone(int t) const { return limit_ > 0 && model_[t].bytes >= limit_; }
};

Groups Sorted(Groups g) {
  for (auto& x : g) std::sort(x.begin(), x.end());
  std::sort(g.begin(), g.end());
  return g;
}

// Greedy fusion of the tensors in index order: the plan expected in order.
// Tensors at the limit each travel alone and leave the open group open.
size_t ExpectedResponses(const std::vector<Tensor>& model, int64_t threshold,
                         int64_t limit) {
  size_t n = 0;
  int64_t open = -1;
  for (const Tensor& t : model) {
    if (limit > 0 && t.bytes >= limit) {
      ++n;
    } else if (open >= 0 && open + t.bytes <= threshold) {
      open += t.bytes;
    } else {
      ++n;
      open = t.bytes;
    }
  }
  return n;
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {8, 16, 32, 64, 128, 256, 512, 1024};
  int steps = 50, tensors = 200, check_steps = 5;
  int64_t fusion = 0, tensor_limit = 0;
  unsigned seed = 1;
  bool drop_one = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--ranks") ranks = ParseList(argv[i + 1]);
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--tensors") tensors = std::atoi(argv[i + 1]);
    else if (a == "--check-steps") check_steps = std::atoi(argv[i + 1]);
    else if (a == "--fusion-bytes") fusion = std::atoll(argv[i + 1]);
    else if (a == "--tensor-limit") tensor_limit = std::atoll(argv[i + 1]);
    else if (a == "--seed") seed = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else if (a == "--drop-one") drop_one = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  bool all_ok = true;
  for (int n : ranks) {
    if (n < 2 || tensors < 2) {
      std::fprintf(stderr, "need at least 2 ranks and 2 tensors\n");
      return 2;
    }
    Sim sim(n, tensors, fusion, tensor_limit);
    const std::vector<Tensor> model = MakeModel(tensors);
    std::mt19937 rng(seed * 7919u + n);
    // Warm-up: names and metadata; the coordinator announces the ids.
    StepResult warm = sim.Step(MakeRounds(kScenarios[0], n, tensors, &rng), false, "warm-up");
    sim.drop_one = drop_one;
    const size_t expected = ExpectedResponses(model, sim.fusion_bytes(), tensor_limit);
    Groups reference;
    std::string json;
    char buf[1024];
    for (const Scenario& s : kScenarios) {
      const bool timed = std::string(s.name) == "inorder";
      const int count = timed ? steps : std::min(steps, check_steps);
      std::vector<double> total, submit, plan, ser, cpu, parse;
      int64_t received = 0, sent = 0;
      for (int k = 0; k < count; ++k) {
        const std::string what = "N=" + std::to_string(n) + " " + s.name + " step " +
                                 std::to_string(k + 1);
        StepResult r = sim.Step(MakeRounds(s, n, tensors, &rng), s.frozen, what);
        total.push_back(r.total_us);
        submit.push_back(r.submit_us);
        plan.push_back(r.plan_us);
        ser.push_back(r.serialize_us);
        cpu.push_back(r.cpu_us);
        parse.push_back(r.parse_us);
        received = r.bytes_received;
        sent = r.bytes_sent;
        if (timed && k == 0) reference = r.groups;
        // Several Plan()s in a step may fuse differently once the held
        // tensors fill the buffer: then only the checks in Step() apply.
        const bool exact = s.canonical && (!s.frozen || expected == 1);
        if ((exact || expected == 1) && r.groups.size() != expected)
          sim.errors.push_back(what + ": " + std::to_string(r.groups.size()) +
                               " responses, expected " + std::to_string(expected));
        const bool same = exact ? r.groups == reference
                                : expected != 1 || Sorted(r.groups) == Sorted(reference);
        if (!same) sim.errors.push_back(what + ": plan differs from the in-order plan");
      }
      std::snprintf(buf, sizeof(buf),
                    "%s\"%s\": {\"steps\": %d, \"median_us\": %.2f, \"p90_us\": %.2f, "
                    "\"min_us\": %.2f, \"cpu_median_us\": %.2f, \"parse_only_median_us\": %.2f, "
                    "\"submit_median_us\": %.2f, \"plan_median_us\": %.2f, "
                    "\"serialize_median_us\": %.2f, \"bytes_received\": %lld, "
                    "\"bytes_sent\": %lld}",
                    json.empty() ? "" : ", ", s.name, count, Quantile(total, 0.5),
                    Quantile(total, 0.9), Quantile(total, 0), Quantile(cpu, 0.5),
                    Quantile(parse, 0.5), Quantile(submit, 0.5), Quantile(plan, 0.5),
                    Quantile(ser, 0.5), static_cast<long long>(received),
                    static_cast<long long>(sent));
      json += buf;
    }
    for (const std::string& e : sim.errors) std::fprintf(stderr, "CHECK FAIL %s\n", e.c_str());
    all_ok = all_ok && sim.errors.empty();
    std::snprintf(buf, sizeof(buf),
                  "{\"ranks\": %d, \"tensors\": %d, \"fusion_threshold_bytes\": %lld, "
                  "\"responses_per_step\": %zu, \"warmup_us\": %.1f, "
                  "\"warmup_bytes_received\": %lld, \"warmup_bytes_sent\": %lld, "
                  "\"ok\": %s, \"errors\": %zu, \"scenarios\": {",
                  n, tensors, static_cast<long long>(sim.fusion_bytes()), reference.size(),
                  warm.total_us, static_cast<long long>(warm.bytes_received),
                  static_cast<long long>(warm.bytes_sent), sim.errors.empty() ? "true" : "false",
                  sim.errors.size());
    std::printf("%s%s}}\n", buf, json.c_str());
    std::fflush(stdout);
  }
  return all_ok ? 0 : 1;
}
