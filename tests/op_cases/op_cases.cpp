// The op table's harness: inputs, the finite-difference check, the device comparison, and which
// virtuals the cases run.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <numeric>
#include <regex>
#include <sstream>

#include "op_case.h"
#include "recording_backend.h"

namespace trainer::op_cases {
namespace {

bool floating(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16; }

Tensor draw(const InputSpec& s, Generator& gen) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  switch (s.values) {
    case InputSpec::Values::uniform:
      for (double& x : v) x = gen.uniform(s.lo, s.hi);
      break;
    case InputSpec::Values::away_from_zero:
      for (double& x : v) x = (gen.uniform() < 0.5 ? -1.0 : 1.0) * gen.uniform(0.2, 1.0);
      break;
    case InputSpec::Values::distinct: {
      // A ramp centred on 0 in steps of 0.1, shuffled: values apart by far more than a difference step.
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = 0.1 * (static_cast<double>(i) - static_cast<double>(n) / 2);
      for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[gen.below(i)]);
      break;
    }
    case InputSpec::Values::labels:
      for (double& x : v) x = static_cast<double>(gen.below(static_cast<uint64_t>(s.classes)));
      break;
    case InputSpec::Values::zeros:
      break;
  }
  return Tensor::from_vector(v, s.shape).to(s.fixed_dtype.value_or(DType::f64));
}

// Rounds the case's floating inputs to `dtype` and back to f64: the values a device run in `dtype`
// sees, for the CPU reference to see them too.
Tensors rounded(const OpCase& c, const Tensors& inputs, DType dtype) {
  Tensors out;
  for (size_t i = 0; i < inputs.size(); ++i)
    out.push_back(c.inputs[i].fixed_dtype ? inputs[i] : inputs[i].to(dtype).to(DType::f64));
  return out;
}

double dot(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to(Device::cpu()).to_vector<double>(), y = b.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

std::string dtype_text(DType d) { return std::string(dtype_name(d)); }

// Scaled comparison: |device - reference| <= rtol * max(|reference|) elementwise (exact for integer
// outputs); NaN must meet NaN.
std::string compare_outputs(const Tensors& reference, const Tensors& device, double rtol) {
  if (reference.size() != device.size()) return "the backends return different numbers of outputs";
  for (size_t k = 0; k < reference.size(); ++k) {
    if (reference[k].shape() != device[k].shape()) return "output " + std::to_string(k) + ": shapes differ";
    const std::vector<double> e = reference[k].to(Device::cpu()).to_vector<double>(),
                              a = device[k].to(Device::cpu()).to_vector<double>();
    double scale = 0;
    for (double x : e)
      if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
    const double atol = floating(device[k].dtype()) ? rtol * std::max(scale, 1e-30) : 0.0;
    for (size_t i = 0; i < e.size(); ++i) {
      const bool ok = std::isnan(e[i]) ? std::isnan(a[i]) : (e[i] == a[i] || std::abs(a[i] - e[i]) <= atol);
      if (!ok) {
        std::ostringstream why;
        why << "output " << k << " element " << i << ": reference " << e[i] << ", device " << a[i]
            << " (tolerance " << atol << ")";
        return why.str();
      }
    }
  }
  return "";
}

double rtol_for(const OpCase& c, DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-10;
    case DType::f32:
      return c.rtol_f32;
    default:
      return 3e-2;  // bf16 / f16 outputs: 8 or 11 bits of mantissa, f32 accumulation
  }
}

}  // namespace

std::vector<OpCase> all_op_cases() {
  std::vector<OpCase> all;
  for (auto family : {elementwise_cases, reduction_cases, conv_matmul_cases, pool_cases, batch_norm_cases,
                      loss_optim_cases, transformer_cases, soft_target_cases, layerwise_optim_cases})
    for (OpCase& c : family()) all.push_back(std::move(c));
  return all;
}

Tensors make_inputs(const OpCase& c, uint64_t seed) {
  Generator gen(seed);
  Tensors inputs;
  for (const InputSpec& s : c.inputs) inputs.push_back(draw(s, gen));
  return inputs;
}

Tensors copies_on(const OpCase& c, const Tensors& inputs, Device device, DType dtype, MemoryFormat format) {
  Tensors out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputSpec& s = c.inputs[i];
    const Tensor value = s.fixed_dtype ? inputs[i] : inputs[i].to(dtype);
    Tensor copy =
        Tensor::empty(value.shape(), value.dtype(), device, s.image ? format : MemoryFormat::contiguous);
    copy.copy_(value);
    out.push_back(copy);
  }
  return out;
}

std::string check_gradients(const OpCase& c, uint64_t seed) {
  Backend& cpu = cpu_backend();
  const Tensors inputs = make_inputs(c, seed);
  auto fresh = [&](const Tensors& from) {
    return copies_on(c, from, Device::cpu(), DType::f64, MemoryFormat::contiguous);
  };
  Tensors first = fresh(inputs);
  const Tensor out = c.run(cpu, first)[0];
  Generator gen(seed + 1);
  Tensor seed_grad = Tensor::empty(out.shape(), DType::f64);
  uniform_(seed_grad, -1.0, 1.0, gen);
  Tensors for_grad = fresh(inputs);
  const Tensors analytic = c.gradient(cpu, for_grad, seed_grad);
  if (analytic.size() != c.differentiable.size()) return "gradient returned the wrong number of tensors";
  constexpr double h = 1e-6, kMaxError = 1e-6;
  for (size_t k = 0; k < c.differentiable.size(); ++k) {
    const int index = c.differentiable[k];
    const std::vector<double> ga = analytic[k].to(DType::f64).contiguous().to_vector<double>();
    Tensors perturbed = fresh(inputs);
    double* x = perturbed[static_cast<size_t>(index)].data<double>();
    for (size_t i = 0; i < ga.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      Tensors plus = fresh(perturbed);
      const double lp = dot(c.run(cpu, plus)[0].to(DType::f64), seed_grad);
      x[i] = saved - h;
      Tensors minus = fresh(perturbed);
      const double lm = dot(c.run(cpu, minus)[0].to(DType::f64), seed_grad);
      x[i] = saved;
      const double numeric = (lp - lm) / (2 * h);
      const double error = std::abs(ga[i] - numeric) / std::max({1.0, std::abs(ga[i]), std::abs(numeric)});
      if (error > kMaxError) {
        std::ostringstream why;
        why << "input " << index << " element " << i << ": analytic " << ga[i] << ", numeric " << numeric;
        return why.str();
      }
    }
  }
  return "";
}

std::string check_on_device(const OpCase& c, Device device, DType dtype, MemoryFormat format, uint64_t seed) {
  const Tensors values = rounded(c, make_inputs(c, seed), dtype);
  Tensors on_cpu = copies_on(c, values, Device::cpu(), DType::f64, MemoryFormat::contiguous);
  Tensors on_device = copies_on(c, values, device, dtype, format);
  const Tensors reference = c.run(cpu_backend(), on_cpu);
  const Tensors result = c.run(backend_for(device), on_device);
  const std::string why =
      c.compare ? c.compare(reference, result) : compare_outputs(reference, result, rtol_for(c, dtype));
  return why.empty() ? ""
                     : dtype_text(dtype) + (format == MemoryFormat::channels_last ? " channels-last" : "") +
                           ": " + why;
}

std::string case_test_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string name = std::to_string(info.param) + "_" + all_op_cases()[info.param].name;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name.substr(0, 80);
}

std::vector<std::string> backend_virtuals(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  const std::regex virtual_fn(R"(virtual\s+[^;{(]*?\b(\w+)\s*\()");
  std::vector<std::string> names;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), virtual_fn); it != std::sregex_iterator(); ++it)
    if ((*it)[1] != "Backend") names.push_back((*it)[1]);
  return names;
}

std::vector<std::string> virtuals_run_by_cases() {
  RecordingBackend recorder(cpu_backend());
  for (const OpCase& c : all_op_cases()) {
    Tensors inputs = copies_on(c, make_inputs(c, 1), Device::cpu(), DType::f64, MemoryFormat::contiguous);
    c.run(recorder, inputs);
    if (c.gradient) {
      Tensors again = copies_on(c, make_inputs(c, 1), Device::cpu(), DType::f64, MemoryFormat::contiguous);
      const Tensor out = c.run(cpu_backend(), again)[0];
      c.gradient(recorder, again, Tensor::ones(out.shape(), DType::f64));
    }
  }
  return {recorder.called().begin(), recorder.called().end()};
}

}  // namespace trainer::op_cases
