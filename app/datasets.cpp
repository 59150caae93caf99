#include "app/datasets.h"

#include <filesystem>

#include "data/data_error.h"
#include "data/fashion_mnist.h"
#include "data/synthetic.h"

namespace trainer {

Datasets open_datasets(const Config& config) {
  const DataConfig& d = config.data;
  if (d.dataset == "synthetic") {
    SyntheticConfig s;
    s.size = d.synthetic_samples;
    s.channels = config.model.in_channels > 0 ? config.model.in_channels : 3;
    s.height = s.width = d.synthetic_image_size;
    s.num_classes = d.synthetic_classes;
    s.seed = static_cast<uint64_t>(config.train.seed);
    SyntheticConfig test = s;
    test.size = std::max<int64_t>(1, s.size / 5);
    test.seed = s.seed + 1;
    return {std::make_shared<SyntheticDataset>(s), std::make_shared<SyntheticDataset>(test)};
  }
  if (d.dataset == "fashion_mnist") {
    const std::string root = d.root.empty() ? kFashionMnistDefaultRoot : d.root;
    if (!std::filesystem::is_directory(root))
      throw config_error_at(config, "data.root",
                            "dataset directory '" + root + "' does not exist. HINT: " +
                                (d.root.empty() ? "apt-get install dataset-fashion-mnist, or set data.root"
                                                : "fix data.root, or remove it to use " +
                                                      std::string(kFashionMnistDefaultRoot)));
    try {
      return {std::make_shared<FashionMnist>(root, "train"), std::make_shared<FashionMnist>(root, "test")};
    } catch (const DataError& e) {
      throw config_error_at(config, "data.root", e.what());
    }
  }
  throw config_error_at(config, "data.dataset",
                        "dataset '" + d.dataset + "' is not available in this build yet (available: " +
                            "fashion_mnist, synthetic)");
}

Normalization resolved_normalization(const Config& config, const Dataset& dataset) {
  if (config.data.normalize_mean.empty()) return dataset.normalization();
  Normalization n;
  for (double m : config.data.normalize_mean) n.mean.push_back(static_cast<float>(m));
  for (double s : config.data.normalize_std) n.std.push_back(static_cast<float>(s));
  return n;
}

}  // namespace trainer
