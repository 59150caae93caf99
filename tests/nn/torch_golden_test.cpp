// Two SGD steps (momentum, weight decay) of a narrow resnet18 (CIFAR stem, width 4, batches of 4
// 16x16 images) against PyTorch's float64 steps stored in tests/nn/golden/ by
// scripts/make_torch_golden.py: each step's loss, logits and every parameter's gradient, the whole
// state after the second step, and each tensor's change over the two steps.
//
// The inputs were drawn so that no pre-activation lies within 1e-4 of a ReLU's kink (the script says
// why): a correct float32 step then agrees with the reference to float32 accuracy whatever kernels
// the BLAS picks, and a disagreement is a defect of ours. The parent test runs the comparison once
// per OpenBLAS kernel set this CPU can execute (OPENBLAS_CORETYPE is read when the library loads, so
// each set runs in a child process of this binary).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "nn/safetensors.h"

extern "C" char* openblas_get_corename(void);

namespace trainer {
namespace {

// The source tree's copy, or the working directory's when the binary runs elsewhere (a GPU host
// that received the build in a bundle runs it from its own copy of the repository).
std::string golden_path() {
  const std::string name = "tests/nn/golden/resnet18_w4_sgd_step.safetensors";
  const std::string in_source = std::string(TRAINER_SOURCE_DIR) + "/" + name;
  return ::access(in_source.c_str(), R_OK) == 0 ? in_source : name;
}

// max|ours - reference| / max|reference|, in double.
double relative_error(const Tensor& ours, const Tensor& reference) {
  const Tensor a = ours.to(DType::f64).contiguous(), b = reference.to(DType::f64).contiguous();
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
    scale = std::max(scale, std::fabs(b.data<double>()[i]));
  }
  return diff / (scale > 0 ? scale : 1.0);
}

// a - b in float64.
Tensor minus(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = a_in.to(DType::f64).contiguous(), b = b_in.to(DType::f64).contiguous();
  Tensor out = Tensor::empty(a.shape(), DType::f64);
  for (int64_t i = 0; i < a.numel(); ++i) out.data<double>()[i] = a.data<double>()[i] - b.data<double>()[i];
  return out;
}

const Tensor& at(const std::map<std::string, Tensor>& golden, const std::string& name) {
  const auto it = golden.find(name);
  if (it == golden.end()) throw std::runtime_error("golden file lacks '" + name + "'");
  return it->second;
}

TEST(TorchGolden, TwoSgdStepsMatchPyTorchFloat64) {
  const auto golden = load_safetensors(golden_path());
  ModelOptions o;
  o.name = "resnet18";
  o.stem = "cifar";
  o.width = 4;
  o.num_classes = 10;
  auto model = create_model(o);
  for (const auto& e : model->state_dict()) e.tensor->copy_(at(golden, "init." + e.name));
  model->train();

  SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  so.weight_decay = 5e-4;
  Sgd opt(model->named_parameters(), so);
  // Float32 against float64, where the network is well conditioned (it is, by construction): PyTorch's
  // own float32 steps are off by up to 1.2e-5 (BatchNorm weight gradients, sums with cancellation)
  // and 1.4e-5 (updates); a real defect is orders of magnitude away (a lost accumulation: 0.67).
  constexpr double kTolerance = 5e-5;
  double worst = 0;
  std::string worst_name;
  auto check = [&](const Tensor& ours, const Tensor& reference, const std::string& name, double tolerance) {
    const double error = relative_error(ours, reference);
    EXPECT_LT(error, tolerance) << name;
    if (error > worst) worst = error, worst_name = name;
  };
  const Tensor& images = at(golden, "images");  // [2, N, C, H, W]: one batch per step
  const Tensor& labels = at(golden, "labels");  // [2, N]
  const int64_t n = images.size(1);
  for (int step = 0; step < 2; ++step) {
    const std::string prefix = "step" + std::to_string(step) + ".";
    Variable logits =
        (*model)(Variable(images.slice(0, step, step + 1).reshape({n, 3, 16, 16}).contiguous()));
    Variable loss = F::cross_entropy(logits, labels.slice(0, step, step + 1).reshape({n}).contiguous());
    for (auto p : model->named_parameters()) p.param.zero_grad();
    loss.backward();
    check(loss.data().reshape({1}), at(golden, prefix + "loss"), prefix + "loss", kTolerance);
    check(logits.data(), at(golden, prefix + "logits"), prefix + "logits", kTolerance);
    for (const auto& p : model->named_parameters())
      check(p.param.grad(), at(golden, prefix + "grad." + p.name), prefix + "grad." + p.name, kTolerance);
    opt.step();
  }
  for (const auto& e : model->state_dict()) {
    const Tensor& after = at(golden, "after." + e.name);
    if (e.tensor->dtype() == DType::i64) {
      EXPECT_EQ(e.tensor->item(), after.item()) << e.name;
      continue;
    }
    check(*e.tensor, after, "after." + e.name, kTolerance);
    // The change itself, which the weights' size would otherwise hide (SGD moves them ~1e-2): it
    // carries the momentum of the second step. Its own rounding is that of the weights, ~1e-7 of them.
    const Tensor init = at(golden, "init." + e.name);
    check(minus(*e.tensor, init), minus(after, init), "update." + e.name, 1e-4);
  }
  std::printf("OpenBLAS kernels %s: worst relative error %.2e (%s)\n", openblas_get_corename(), worst,
              worst_name.c_str());
}

// OpenBLAS's x86-64 kernel sets and whether this CPU can execute each.
struct KernelSet {
  const char* name;
  bool runs_here;
};

std::vector<KernelSet> kernel_sets() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512cd");
  return {{"Prescott", true},
          {"Core2", __builtin_cpu_supports("ssse3")},
          {"Nehalem", __builtin_cpu_supports("sse4.2")},
          {"Sandybridge", __builtin_cpu_supports("avx")},
          {"Haswell", avx2},
          {"Zen", avx2},
          {"SkylakeX", avx512},
          {"Cooperlake", avx512 && __builtin_cpu_supports("avx512bf16")}};
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// In a child started by the test below: the kernels OpenBLAS loaded must be the ones asked for.
TEST(TorchGolden, ChildUsesTheRequestedKernelSet) {
  const char* wanted = std::getenv("TRAINER_TEST_BLAS_CHILD");
  if (!wanted) GTEST_SKIP() << "runs only as a child of EveryOpenBlasKernelSetComputesTheSameStep";
  EXPECT_EQ(lower(openblas_get_corename()), lower(wanted));
}

TEST(TorchGolden, EveryOpenBlasKernelSetComputesTheSameStep) {
  if (std::getenv("TRAINER_TEST_BLAS_CHILD")) GTEST_SKIP() << "already a child";
  std::string ran;
  for (const KernelSet& set : kernel_sets()) {
    if (!set.runs_here) continue;
    const std::string command =
        std::string("OPENBLAS_CORETYPE=") + set.name + " TRAINER_TEST_BLAS_CHILD=" + set.name +
        " /proc/self/exe --gtest_filter='TorchGolden.TwoSgdSteps*:TorchGolden.Child*' "
        "--gtest_brief=1 2>&1";
    // /proc/self/exe inside the shell would be the shell: resolve it here.
    std::array<char, 4096> self{};
    const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
    ASSERT_GT(n, 0);
    std::string resolved = command;
    resolved.replace(resolved.find("/proc/self/exe"), 14, std::string(self.data(), static_cast<size_t>(n)));
    FILE* pipe = ::popen(resolved.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    char buf[512];
    while (std::fgets(buf, sizeof buf, pipe)) output += buf;
    const int status = ::pclose(pipe);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "OPENBLAS_CORETYPE=" << set.name << ":\n"
                                                               << output;
    ran += std::string(ran.empty() ? "" : ", ") + set.name;
  }
  std::printf("kernel sets checked: %s\n", ran.c_str());
}

}  // namespace
}  // namespace trainer
