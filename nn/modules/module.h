#pragma once
// Base of all layers and models. Parameters and buffers are registered under names that, joined with
// dots through the hierarchy, equal torchvision's state_dict keys ("layer1.0.conv1.weight",
// "bn1.running_mean"), so weights travel to and from PyTorch unchanged.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/autograd/variable.h"

namespace trainer {

struct NamedParameter {
  std::string name;
  Variable param;
};

struct NamedBuffer {
  std::string name;
  Tensor* buffer;  // points into the owning module; valid while the module lives
};

// One entry of a state dict: a parameter's data or a buffer.
struct NamedTensor {
  std::string name;
  Tensor* tensor;  // points into the owning module; valid while the module lives
  bool is_buffer;
};

class Module {
 public:
  virtual ~Module() = default;
  virtual Variable forward(const Variable& x) = 0;
  Variable operator()(const Variable& x) { return forward(x); }

  // All parameters / buffers of this module and its children, in registration order.
  std::vector<NamedParameter> named_parameters(const std::string& prefix = "") const;
  std::vector<NamedBuffer> named_buffers(const std::string& prefix = "");
  std::vector<Variable> parameters() const;
  int64_t parameter_count() const;
  // Parameters and buffers in PyTorch's state_dict order (each module's parameters, then its buffers,
  // then its children), so keys and order equal torchvision's.
  std::vector<NamedTensor> state_dict(const std::string& prefix = "");
  // This module (named `prefix` with its trailing dot removed, "" at the root) and every module below
  // it, in pre-order.
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();
  // Moves every parameter and buffer to `device` and casts floating ones to `dtype` in place.
  void to(Device device);
  void to(DType dtype);
  // Lays out every 4-D parameter and buffer in `format`, in place (PyTorch's
  // model.to(memory_format=...)). A channels-last network with channels-last convolution weights
  // casts them to half precision (autocast) and back (their gradients) as flat copies instead of
  // transposing ones.
  void to(MemoryFormat format);

  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  // A tensor read from a weights file under `name` (a full state-dict name, asked of the root module)
  // whose shape differs from the model's: the module may convert it to the model's shape, as the ViT
  // resizes a position embedding trained at another image size; nullopt (the default) refuses it.
  virtual std::optional<Tensor> adapt_loaded_tensor(const std::string& name, const Tensor& stored) const {
    (void)name;
    (void)stored;
    return std::nullopt;
  }

 protected:
  Variable& register_parameter(std::string name, Tensor value);
  Tensor& register_buffer(std::string name, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    children_.emplace_back(std::move(name), module);
    return module;
  }
  virtual void on_train_mode_change() {}

  bool training_ = true;

 private:
  // unique_ptr keeps addresses stable so NamedBuffer pointers and references stay valid.
  std::vector<std::pair<std::string, std::unique_ptr<Variable>>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Tensor>>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace trainer
