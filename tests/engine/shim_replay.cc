// onebit-shim-replay: one rank of a C++ optimizer shim (include/onebit/{onebit_adam,zero_one_adam,
// onebit_lamb}.hpp) fed the gradient stream tests/python/shim_languages_check.py feeds the Python
// one, so that the two languages' results can be compared bit for bit. The communicator comes from
// the environment (onebit_comm_init_env); writes this rank's parameters, m and v (float32, in that
// order, the groups end to end), then the optimizer's counters (int64: OnebitAdam its steps and
// freeze step, -1 while undecided; ZeroOneAdam its schedule; OnebitLamb its steps) to OUT.
//
//   onebit-shim-replay --optimizer adam|zero_one|lamb --steps S --freeze N|auto
//                      [--window W --threshold T --max-step M] [--bias-correction 1] [--deepspeed 1]
//                      [--save-at K | --resume-at K [--job 1]] [--checkpoints DIR] --out OUT
//
// --save-at K: after K steps, each rank writes its parameters (DIR/params-RANK.bin, float32) and its
// optimizer's checkpoint file (DIR/optimizer-RANK.ckpt, save_file()), then goes on. --resume-at K:
// each rank starts from those files (whichever language wrote them) and takes steps K..S-1; with
// --job 1 from its part of the job's one file DIR/optimizer-job.ckpt (Python's
// save_file(path, consolidated=True)) instead.
//
// The stream (the checker's twin, kept by it): two groups of kSizes[g] parameters, parameter i of
// the groups end to end starting at (i % 61 - 30) / 64; rank r's gradient at step t, element i, is
// ((r * 1000003 + t * 7919 + i * 104729) % 4097 - 2048) / 2048 — dyadic, so that every sum over
// ranks is exact and the ranks' average is the same bits whichever order a transport adds in.
// Group 1 takes another lr and weight decay; ZeroOneAdam var_update_scaler 2, local_step_scaler 4,
// local_step_clipper 4 (its every kind of step within a few); OnebitLamb its defaults otherwise.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "onebit/onebit.h"
#include "onebit/onebit_adam.hpp"
#include "onebit/onebit_lamb.hpp"
#include "onebit/zero_one_adam.hpp"

namespace {

constexpr std::size_t kSizes[] = {1000, 37};

float gradient(int rank, std::int64_t step, std::size_t i) {
  const std::int64_t h = (rank * 1000003LL + step * 7919LL + static_cast<std::int64_t>(i) * 104729LL) % 4097;
  return static_cast<float>(h - 2048) / 2048.0f;
}

// Group g's lr and weight decay (group 1 another of each: the groups' settings reach their own elements).
constexpr float kLr[] = {1e-3f, 3e-3f};
constexpr float kWeightDecay[] = {0.0f, 0.01f};

onebit_adam_config_t adam_config(int g, std::int64_t freeze) {
  return {kLr[g], 0.9f, 0.999f, 1e-8f, kWeightDecay[g], freeze};
}

onebit_zero_one_adam_config_t zero_one_config(int g, std::int64_t freeze) {
  return {kLr[g], 0.9f, 0.999f, 1e-8f, kWeightDecay[g], freeze, 2, 4, 4};
}

onebit_lamb_config_t lamb_config(int g, std::int64_t freeze) {
  return {kLr[g], 0.9f, 0.999f, 1e-8f, kWeightDecay[g], freeze, 10.0, 0.01, 0.9, 4.0, 0.5, 0.1};
}

// Where a run saves or resumes a checkpoint (--save-at, --resume-at): none when at < 0.
struct CheckpointAt {
  std::int64_t save = -1, resume = -1;
  bool job = false;
  std::string dir;
  std::string params(int rank) const { return dir + "/params-" + std::to_string(rank) + ".bin"; }
  std::string optimizer(int rank) const {
    return dir + "/optimizer-" + (job ? std::string("job") : std::to_string(rank)) + ".ckpt";
  }
};

void write_floats(const std::string& path, const std::vector<float>& values) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) throw std::runtime_error("cannot write " + path);
  std::fwrite(values.data(), sizeof(float), values.size(), file);
  std::fclose(file);
}

void read_floats(const std::string& path, std::vector<float>& values) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot read " + path);
  const std::size_t got = std::fread(values.data(), sizeof(float), values.size(), file);
  std::fclose(file);
  if (got != values.size()) throw std::runtime_error(path + " is short");
}

// Runs `Optimizer` over `params` with `make_config(g, freeze)` per group and writes OUT; `counters`
// gives the optimizer's counters; `at` where it saves or resumes a checkpoint.
template <typename Optimizer, typename MakeConfig, typename Counters, typename... Extra>
void replay(onebit_comm_t comm, int rank, std::vector<float>& params, std::int64_t steps, std::int64_t freeze,
            MakeConfig make_config, Counters counters, const std::string& out, const CheckpointAt& checkpoint,
            Extra... extra) {
  std::vector<float> grads(params.size());
  std::vector<typename Optimizer::ParamGroup> groups;
  std::vector<const float*> group_grads;
  std::size_t at = 0;
  for (int g = 0; g < 2; ++g) {
    groups.push_back({params.data() + at, kSizes[g], make_config(g, freeze)});
    group_grads.push_back(grads.data() + at);
    at += kSizes[g];
  }
  Optimizer optimizer(comm, groups, extra...);
  if (checkpoint.resume >= 0) {
    read_floats(checkpoint.params(rank), params);
    optimizer.load_file(checkpoint.optimizer(rank));
  }
  for (std::int64_t t = std::max<std::int64_t>(checkpoint.resume, 0); t < steps; ++t) {
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = gradient(rank, t, i);
    optimizer.step(group_grads);
    if (t + 1 == checkpoint.save) {
      write_floats(checkpoint.params(rank), params);
      optimizer.save_file(checkpoint.optimizer(rank));
    }
  }
  const auto saved = optimizer.save();
  const std::vector<std::int64_t> said = counters(optimizer);
  std::FILE* file = std::fopen(out.c_str(), "wb");
  if (file == nullptr) throw std::runtime_error("cannot write " + out);
  std::fwrite(params.data(), sizeof(float), params.size(), file);
  std::fwrite(saved.m.data(), sizeof(float), saved.m.size(), file);
  std::fwrite(saved.v.data(), sizeof(float), saved.v.size(), file);
  std::fwrite(said.data(), sizeof(std::int64_t), said.size(), file);
  std::fclose(file);
}

int fail(const std::string& what) {
  std::fprintf(stderr, "onebit-shim-replay: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t steps = 0, freeze = -1;
  bool automatic = false, bias_correction = false, deepspeed = false;
  onebit_adam_auto_freeze_t rule{10, 0.1, 0};
  std::string optimizer = "adam", out;
  CheckpointAt at;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string flag = argv[a], value = argv[a + 1];
    if (flag == "--optimizer") optimizer = value;
    else if (flag == "--steps") steps = std::atoll(value.c_str());
    else if (flag == "--freeze" && value == "auto") automatic = true;
    else if (flag == "--freeze") freeze = std::atoll(value.c_str());
    else if (flag == "--window") rule.window = std::atoll(value.c_str());
    else if (flag == "--threshold") rule.threshold = std::atof(value.c_str());
    else if (flag == "--max-step") rule.max_step = std::atoll(value.c_str());
    else if (flag == "--bias-correction") bias_correction = value == "1";
    else if (flag == "--deepspeed") deepspeed = value == "1";
    else if (flag == "--save-at") at.save = std::atoll(value.c_str());
    else if (flag == "--resume-at") at.resume = std::atoll(value.c_str());
    else if (flag == "--checkpoints") at.dir = value;
    else if (flag == "--job") at.job = value == "1";
    else if (flag == "--out") out = value;
    else return fail("unknown flag " + flag);
  }
  if (out.empty() || steps <= 0 || (!automatic && freeze < 0)) return fail("give --steps, --freeze and --out");
  if (automatic && optimizer != "adam") return fail("--freeze auto is OnebitAdam's");

  onebit_comm_t comm = nullptr;
  if (onebit_comm_init_env(&comm) != ONEBIT_SUCCESS) return fail(onebit_last_error());
  int rank = 0;
  onebit_comm_rank(comm, &rank);
  std::vector<float> params(kSizes[0] + kSizes[1]);
  for (std::size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(static_cast<int>(i % 61) - 30) / 64.0f;
  try {
    if (optimizer == "adam") {
      const auto counters = [](const onebit::OnebitAdam& o) {
        return std::vector<std::int64_t>{o.steps(), o.freeze_step()};
      };
      // The driver's whole schedule (onebit.h, "OnebitAdam's driver"): DeepSpeed's and bias correction too.
      const onebit_adam_schedule_t schedule{automatic ? -1 : freeze, rule, deepspeed ? 1 : 0, bias_correction ? 1 : 0};
      replay<onebit::OnebitAdam>(comm, rank, params, steps, automatic ? 0 : freeze, adam_config, counters, out, at,
                                 std::string("onebit_adam/momentum"), schedule);
    } else if (optimizer == "zero_one") {
      const auto counters = [](const onebit::ZeroOneAdam& o) {
        const onebit_zero_one_adam_schedule_t& s = o.schedule();
        return std::vector<std::int64_t>{s.step, s.var_interval, s.var_counter, s.local_step_interval,
                                         s.local_step_counter};
      };
      replay<onebit::ZeroOneAdam>(comm, rank, params, steps, freeze, zero_one_config, counters, out, at);
    } else if (optimizer == "lamb") {
      const auto counters = [](const onebit::OnebitLamb& o) { return std::vector<std::int64_t>{o.steps()}; };
      replay<onebit::OnebitLamb>(comm, rank, params, steps, freeze, lamb_config, counters, out, at);
    } else {
      return fail("unknown optimizer " + optimizer);
    }
  } catch (const std::exception& error) {
    return fail(error.what());
  }
  onebit_comm_destroy(comm);
  return 0;
}
