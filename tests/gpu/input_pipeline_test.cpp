// The GPU input path: pinned batches, uploads on the copy stream, normalisation on the device
// (data/device_prefetcher.h), against the CPU path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "data/device_prefetcher.h"
#include "data/normalize.h"
#include "data/synthetic.h"
#include "nn/cuda/copy_stream.h"
#include "nn/cuda/normalize_input.h"
#include "nn/cuda/pinned_allocator.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using gpu_test::gpu;
using gpu_test::on_gpu;

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// Every u8 value in every channel, in both output layouts: equal bit for bit (the kernel uses the
// same correctly rounded float operations as the CPU's table).
TEST(InputPipeline, DeviceNormalisationEqualsCpuBitForBit) {
  REQUIRE_GPU();
  Tensor u8 = Tensor::empty({4, 8, 8, 3}, DType::u8);  // [B, H, W, C]
  uint8_t* p = u8.data<uint8_t>();
  for (int64_t i = 0; i < u8.numel(); ++i) p[i] = static_cast<uint8_t>((i * 7) % 256);
  const std::vector<float> mean = {0.4914f, 0.4822f, 0.4465f}, std = {0.2470f, 0.2435f, 0.2616f};
  const Tensor expected = to_float_normalized(u8, mean, std);  // [B, C, H, W]
  for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    const Tensor got = cuda::normalize_u8_nhwc(on_gpu(u8), mean, std, format);
    EXPECT_TRUE(got.device().is_cuda());
    EXPECT_TRUE(got.is_contiguous(format));
    EXPECT_TRUE(same_bytes(got, expected));
  }
  // One statistic for every channel, and one channel.
  const Tensor grey = u8.slice(3, 0, 1).contiguous();
  EXPECT_TRUE(same_bytes(cuda::normalize_u8_nhwc(on_gpu(grey), {0.5f}, {0.25f}),
                         to_float_normalized(grey, {0.5f}, {0.25f})));
  EXPECT_THROW(cuda::normalize_u8_nhwc(on_gpu(u8), {0.5f, 0.5f}, {1.0f}), std::invalid_argument);
  EXPECT_THROW(cuda::normalize_u8_nhwc(on_gpu(u8), {0.5f}, {0.0f}), std::invalid_argument);
  EXPECT_THROW(cuda::normalize_u8_nhwc(u8, {0.5f}, {1.0f}), std::invalid_argument);  // on the host
}

TEST(InputPipeline, BatchAllocatorGivesPinnedMemory) {
  REQUIRE_GPU();
  const BatchAllocator allocate = batch_allocator_for(gpu());
  ASSERT_TRUE(allocate);
  const Tensor t = allocate({2, 4, 4, 3}, DType::u8);
  EXPECT_TRUE(t.device().is_cpu());
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, t.raw_data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);  // page-locked, not unregistered (pageable)
}

// A whole epoch through pinned batches, 2 workers and the copy stream equals the synchronous path:
// batches from a loader without workers, normalised on the host and copied.
TEST(InputPipeline, PrefetchedBatchesEqualTheSynchronousPath) {
  REQUIRE_GPU();
  const auto dataset = std::make_shared<SyntheticDataset>(SyntheticConfig{203, 3, 16, 16, 10, 3});
  std::vector<int64_t> indices(203);
  for (int64_t i = 0; i < 203; ++i) indices[static_cast<size_t>(i)] = (i * 37) % 203;
  LoaderOptions options;
  options.batch_size = 32;
  options.transforms.crop_padding = 4;
  options.transforms.horizontal_flip = true;
  options.seed = 11;
  const std::vector<float> mean = {0.5f, 0.4f, 0.3f}, std = {0.2f, 0.3f, 0.25f};
  DataLoader reference(dataset, indices, options);
  options.num_workers = 2;
  options.allocate_batch = batch_allocator_for(gpu());
  DataLoader loader(dataset, indices, options);
  DevicePrefetcher input(loader, gpu(), {mean, std, MemoryFormat::channels_last});
  int64_t count = 0;
  while (std::optional<Batch> expected = reference.next()) {
    std::optional<Batch> batch = input.next();
    ASSERT_TRUE(batch);
    ASSERT_EQ(batch->batch_index, expected->batch_index);
    const DeviceBatch got = input.to_device(*batch);
    EXPECT_TRUE(got.images.is_contiguous(MemoryFormat::channels_last));
    EXPECT_TRUE(same_bytes(got.images, to_float_normalized(expected->images, mean, std).to(gpu())))
        << "batch " << count;
    EXPECT_EQ(got.labels.to_vector<int64_t>(), expected->labels.to_vector<int64_t>());
    ++count;
  }
  EXPECT_EQ(count, 7);
  EXPECT_FALSE(input.next());
  EXPECT_THROW(input.to_device(Batch{}), std::logic_error);
}

// The loader frees a batch's host tensors once the training loop is done with them, and the pinned
// cache hands the block to the next batch at once. An upload must hold its host block until the DMA
// has read it: while it does, the cache gives a writer another block, and the device gets the
// original bytes whatever the host writes meanwhile.
TEST(InputPipeline, HostBufferIsNotReusedBeforeItsCopyCompleted) {
  REQUIRE_GPU();
  CachingHostAllocator& pinned = cuda::pinned_host_allocator();
  const Shape shape = {256, 1024, 1024};  // 256 MiB: the copy takes milliseconds
  Tensor host = Tensor::empty_from(pinned, shape, DType::u8);
  std::memset(host.raw_data(), 0xAB, host.nbytes());
  const void* block = host.raw_data();

  cuda::CopyStream stream;
  cuda::AsyncUpload upload = stream.upload({host});
  host = Tensor();  // the loader's reference is gone; only the upload's remains
  EXPECT_EQ(upload.host_tensors().size(), 1u);

  Tensor next_batch = Tensor::empty_from(pinned, shape, DType::u8);
  EXPECT_NE(next_batch.raw_data(), block);  // the block under copy is not handed out
  std::memset(next_batch.raw_data(), 0x00, next_batch.nbytes());

  const Tensor on_device = upload.device_tensors_for_compute()[0];
  const Tensor back = on_device.to(Device::cpu());
  const uint8_t* b = back.data<uint8_t>();
  EXPECT_TRUE(std::all_of(b, b + back.nbytes(), [](uint8_t v) { return v == 0xAB; }));

  upload.synchronize();  // copy complete: the block goes back to the cache
  EXPECT_TRUE(upload.complete());
  EXPECT_TRUE(upload.host_tensors().empty());
  const Tensor reused = Tensor::empty_from(pinned, shape, DType::u8);
  EXPECT_EQ(reused.raw_data(), block);
}

}  // namespace
}  // namespace trainer
