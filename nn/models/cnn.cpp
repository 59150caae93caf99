#include "nn/models/cnn.h"

#include <stdexcept>

#include "nn/functional.h"

// PyTorch equivalent (same state_dict keys and order):
//   class Cnn(nn.Module):
//     def __init__(self, c, size, classes, p):
//       super().__init__()
//       self.conv1 = nn.Conv2d(c, 32, 3, padding=1); self.bn1 = nn.BatchNorm2d(32)
//       self.conv2 = nn.Conv2d(32, 64, 3, padding=1); self.bn2 = nn.BatchNorm2d(64)
//       self.pool = nn.MaxPool2d(2)
//       self.fc1 = nn.Linear(64 * (size // 4) ** 2, 128)
//       self.dropout = nn.Dropout(p)  # only when p > 0
//       self.fc2 = nn.Linear(128, classes)
//     def forward(self, x):
//       x = self.pool(F.relu(self.bn1(self.conv1(x))))
//       x = self.pool(F.relu(self.bn2(self.conv2(x))))
//       return self.fc2(self.dropout(F.relu(self.fc1(x.flatten(1)))))

namespace trainer {

Cnn::Cnn(int64_t in_channels, int64_t image_size, int64_t num_classes, double dropout,
         std::shared_ptr<Generator> dropout_gen, Generator& gen)
    : image_size_(image_size) {
  const int64_t pooled = image_size / 2 / 2;  // two floor-mode 2x2 max-pools
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_channels, 32, 3, 1, 1, 1, 1, true, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(32));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(32, 64, 3, 1, 1, 1, 1, true, gen));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(64));
  pool_ = register_module("pool", std::make_shared<MaxPool2d>(2));
  fc1_ = register_module("fc1", std::make_shared<Linear>(64 * pooled * pooled, 128, true, gen));
  if (dropout > 0.0)
    dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout, std::move(dropout_gen)));
  fc2_ = register_module("fc2", std::make_shared<Linear>(128, num_classes, true, gen));
}

Variable Cnn::forward(const Variable& x) {
  if (x.dim() != 4 || x.size(2) != image_size_ || x.size(3) != image_size_)
    throw std::invalid_argument("cnn was built for images of " + std::to_string(image_size_) + "x" +
                                std::to_string(image_size_) + ", got input " + shape_str(x.shape()));
  Variable h = pool_->forward(F::relu(bn1_->forward(conv1_->forward(x))));  // [N, 32, H/2, W/2]
  h = pool_->forward(F::relu(bn2_->forward(conv2_->forward(h))));           // [N, 64, H/4, W/4]
  h = F::relu(fc1_->forward(F::flatten(h, 1)));                             // [N, 128]
  if (dropout_) h = dropout_->forward(h);
  return fc2_->forward(h);
}

std::shared_ptr<Module> make_cnn(const ModelOptions& o) {
  if (o.image_size < 4)
    throw std::invalid_argument("model 'cnn': image_size must be at least 4 (two 2x2 max-pools), got " +
                                std::to_string(o.image_size));
  Generator gen(o.seed);
  return std::make_shared<Cnn>(o.in_channels, o.image_size, o.num_classes, o.dropout,
                               dropout_generator_for(o), gen);
}

}  // namespace trainer
