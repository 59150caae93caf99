#include "data/device_prefetcher.h"

#include <gtest/gtest.h>

#include <cstring>

#include "data/normalize.h"
#include "data/synthetic.h"
#include "nn/runtime.h"

namespace trainer {
namespace {

LoaderOptions options_with(int workers) {
  LoaderOptions options;
  options.batch_size = 8;
  options.transforms.crop_padding = 2;
  options.transforms.horizontal_flip = true;
  options.seed = 5;
  options.num_workers = workers;
  return options;
}

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = i;
  return indices;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.is_contiguous() && b.is_contiguous() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(DevicePrefetcher, CpuAllocatorIsTheLoadersDefault) { EXPECT_FALSE(batch_allocator_for(Device::cpu())); }

// On the CPU the prefetcher is today's path exactly: the loader's batches, normalised on the host.
TEST(DevicePrefetcher, CpuBatchesEqualTheLoaderAndToFloatNormalized) {
  const auto dataset = std::make_shared<SyntheticDataset>(SyntheticConfig{37, 3, 6, 5, 10, 3});
  const std::vector<float> mean = {0.4f, 0.5f, 0.6f}, std = {0.2f, 0.25f, 0.3f};
  DataLoader reference(dataset, all_indices(37), options_with(0));
  DataLoader loader(dataset, all_indices(37), options_with(2));
  DevicePrefetcher input(loader, Device::cpu(), {mean, std, MemoryFormat::channels_last});
  int64_t count = 0;
  while (std::optional<Batch> expected = reference.next()) {
    std::optional<Batch> batch = input.next();
    ASSERT_TRUE(batch);
    EXPECT_EQ(batch->batch_index, expected->batch_index);
    const DeviceBatch got = input.to_device(*batch);
    EXPECT_TRUE(got.images.device().is_cpu());
    EXPECT_TRUE(got.images.is_contiguous(MemoryFormat::channels_last));
    EXPECT_TRUE(same_bytes(got.images.contiguous(), to_float_normalized(expected->images, mean, std)));
    EXPECT_EQ(got.labels.to_vector<int64_t>(), expected->labels.to_vector<int64_t>());
    ++count;
  }
  EXPECT_EQ(count, 5);  // 37 samples in batches of 8
  EXPECT_FALSE(input.next());
}

TEST(DevicePrefetcher, CudaDeviceIsAnErrorWithoutTheCudaBackend) {
  if (runtime::cuda_built()) GTEST_SKIP() << "this build has the CUDA backend";
  const auto dataset = std::make_shared<SyntheticDataset>(SyntheticConfig{4, 1, 2, 2, 2, 0});
  DataLoader loader(dataset, all_indices(4), options_with(0));
  EXPECT_THROW(DevicePrefetcher(loader, Device::cuda(0), {{0.5f}, {0.5f}}), std::invalid_argument);
}

}  // namespace
}  // namespace trainer
