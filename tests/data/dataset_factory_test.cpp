// The config -> dataset factory (app/run/datasets.cpp) for the datasets of data/, and the shipped configs
// that use them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/run/datasets.h"
#include "data/cifar.h"
#include "data/image_codec.h"
#include "data/image_folder.h"
#include "data/temp_dir.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_bytes;

std::string error_of(const Config& config) {
  try {
    open_datasets(config, 1);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

void write_cifar10(const fs::path& dir) {
  fs::create_directories(dir);
  for (const std::string name :
       {"data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"}) {
    std::vector<uint8_t> record(3073, 9);
    write_bytes((dir / (name + ".bin")).string(), record);
  }
}

void write_image(const fs::path& path) {
  fs::create_directories(path.parent_path());
  const std::vector<uint8_t> pixels(12 * 10 * 3, 128);
  write_bytes(path.string(), encode_png(pixels.data(), 12, 10, 3));
}

TEST(DatasetFactory, ShippedConfigsLoad) {
  const Config cifar = load_config(std::string(TRAINER_SOURCE_DIR) + "/configs/cifar10_resnet18.toml");
  EXPECT_EQ(cifar.data.dataset, "cifar10");
  EXPECT_EQ(cifar.model.name, "resnet18");
  EXPECT_EQ(cifar.model.stem, StemChoice::cifar);
  EXPECT_EQ(cifar.data.batch_size, 128);
  EXPECT_EQ(cifar.data.random_crop_padding, 4);
  EXPECT_TRUE(cifar.data.hflip);
  EXPECT_TRUE(cifar.optim.nesterov);
  EXPECT_DOUBLE_EQ(cifar.optim.weight_decay, 5e-4);
  EXPECT_DOUBLE_EQ(cifar.train.label_smoothing, 0.1);
  EXPECT_EQ(cifar.train.epochs, 30);
  EXPECT_EQ(cifar.schedule.name, ScheduleKind::cosine);

  const Config folder = load_config(std::string(TRAINER_SOURCE_DIR) + "/configs/imagefolder_resnet50.toml");
  EXPECT_EQ(folder.data.dataset, "image_folder");
  EXPECT_EQ(folder.model.name, "resnet50");
  EXPECT_EQ(folder.model.stem, StemChoice::imagenet);
  EXPECT_EQ(folder.data.image_size, 224);
  EXPECT_EQ(folder.data.batch_size, 64);
  EXPECT_EQ(folder.optim.lr_scaling, LrScaling::linear);
  EXPECT_EQ(folder.optim.base_batch_size, 256);
  EXPECT_DOUBLE_EQ(folder.schedule.warmup_epochs, 5.0);
  EXPECT_EQ(folder.train.epochs, 90);
}

TEST(DatasetFactory, CifarNeedsAnExistingRoot) {
  std::string error = error_of(load_config("", {"data.dataset=cifar10"}));
  EXPECT_NE(error.find("data.root: dataset 'cifar10' needs data.root. HINT: download the binary version"),
            std::string::npos)
      << error;
  error = error_of(load_config("", {"data.dataset=cifar100", "data.root=/nonexistent/cifar"}));
  EXPECT_NE(
      error.find("--set data.root=/nonexistent/cifar: data.root: dataset directory '/nonexistent/cifar' "
                 "does not exist. HINT"),
      std::string::npos)
      << error;
  EXPECT_NE(error.find("cifar-100-binary.tar.gz"), std::string::npos) << error;

  TempDir dir;
  write_cifar10(dir.path() / "cifar-10-batches-bin");
  const Datasets datasets =
      open_datasets(load_config("", {"data.dataset=cifar10", "data.root=" + dir.path().string()}), 1);
  EXPECT_EQ(datasets.train->size(), 5);
  EXPECT_EQ(datasets.test->size(), 1);
  EXPECT_EQ(datasets.train->label(0), 9);
  // A file problem is reported against data.root too.
  write_bytes((dir.path() / "cifar-10-batches-bin" / "test_batch.bin").string(), {1, 2, 3});
  error = error_of(load_config("", {"data.dataset=cifar10", "data.root=" + dir.path().string()}));
  EXPECT_NE(error.find("data.root: " + (dir.path() / "cifar-10-batches-bin" / "test_batch.bin").string() +
                       ": 3 bytes"),
            std::string::npos)
      << error;
  error = error_of(
      load_config("", {"data.dataset=cifar10", "data.root=" + dir.path().string(), "data.image_size=64"}));
  EXPECT_NE(error.find("data.image_size: CIFAR images are 32x32"), std::string::npos) << error;
}

TEST(DatasetFactory, ImageFolderUsesTrainAndValWithTheTrainingClasses) {
  TempDir dir;
  write_image(dir.path() / "train" / "b" / "1.png");
  write_image(dir.path() / "train" / "a" / "1.png");
  write_image(dir.path() / "train" / "a" / "2.png");
  write_image(dir.path() / "val" / "b" / "1.png");  // class a has no validation image
  const Datasets datasets =
      open_datasets(load_config("", {"data.dataset=image_folder", "data.root=" + dir.path().string()}), 1);
  EXPECT_EQ(datasets.train->size(), 3);
  EXPECT_EQ(datasets.train->height(), 224);  // image_size 0 = 224
  EXPECT_EQ(datasets.test->size(), 1);
  EXPECT_EQ(datasets.test->num_classes(), 2);
  EXPECT_EQ(datasets.test->label(0), 1);
  EXPECT_TRUE(dynamic_cast<const ImageFolder&>(*datasets.train).options().train);
  EXPECT_FALSE(dynamic_cast<const ImageFolder&>(*datasets.test).options().train);
  // With bad_samples = "skip", training replaces an unreadable image, evaluation leaves it out.
  EXPECT_FALSE(dynamic_cast<const ImageFolder&>(*datasets.train).options().drop_bad_samples);
  EXPECT_TRUE(dynamic_cast<const ImageFolder&>(*datasets.test).options().drop_bad_samples);

  const Datasets small =
      open_datasets(load_config("", {"data.dataset=image_folder", "data.root=" + dir.path().string(),
                                     "data.image_size=64", "model.in_channels=1"}),
                    1);
  EXPECT_EQ(small.train->height(), 64);
  EXPECT_EQ(small.train->channels(), 1);
}

TEST(DatasetFactory, ImageFolderLayoutErrorsPointAtDataRoot) {
  std::string error = error_of(load_config("", {"data.dataset=image_folder"}));
  EXPECT_NE(error.find("data.root: dataset 'image_folder' needs data.root. HINT"), std::string::npos)
      << error;
  TempDir dir;
  write_image(dir.path() / "cats" / "1.png");  // flat: no train/ and val/
  error = error_of(load_config("", {"data.dataset=image_folder", "data.root=" + dir.path().string()}));
  EXPECT_NE(error.find("data.root: '" + dir.path().string() + "' has no train/ directory. HINT"),
            std::string::npos)
      << error;
  write_image(dir.path() / "train" / "cats" / "1.png");
  write_image(dir.path() / "test" / "dogs" / "1.png");  // test/ stands in for val/
  error = error_of(load_config("", {"data.dataset=image_folder", "data.root=" + dir.path().string()}));
  EXPECT_NE(error.find("class directory 'dogs' is not one of the 1 training classes"), std::string::npos)
      << error;
  error = error_of(load_config(
      "", {"data.dataset=image_folder", "data.root=" + dir.path().string(), "model.in_channels=2"}));
  EXPECT_NE(error.find("model.in_channels: image_folder decodes images to 1 (grey) or 3 (RGB) channels"),
            std::string::npos)
      << error;
}

// data.image_size resizes image_folder samples only; the datasets stored at one size refuse another, as
// CIFAR does, instead of silently training at their own size (issue 30).
TEST(DatasetFactory, ImageSizeIsRefusedByDatasetsThatAreNotResized) {
  std::string error = error_of(load_config("", {"data.dataset=fashion_mnist", "data.image_size=64"}));
  EXPECT_NE(error.find("data.image_size: Fashion-MNIST images are 28x28 and are not resized. HINT: remove "
                       "data.image_size or set it to 0"),
            std::string::npos)
      << error;
  error = error_of(load_config("", {"data.dataset=synthetic", "data.image_size=64"}));
  EXPECT_NE(
      error.find("data.image_size: synthetic images are 32x32 (data.synthetic_image_size) and are not "
                 "resized. HINT: set data.synthetic_image_size = 64 instead, or remove data.image_size"),
      std::string::npos)
      << error;
  // Their own size is accepted, as 32 is for CIFAR.
  EXPECT_EQ(error_of(load_config("", {"data.dataset=synthetic", "data.synthetic_image_size=12",
                                      "data.image_size=12", "data.synthetic_samples=10"})),
            "");
}

// A dataset path that exists but cannot be read is reported with the real cause, not as missing with an
// install hint (issue 30). A symbolic-link loop fails the same way for root as permissions do for users.
TEST(DatasetFactory, AnUnreadableDatasetPathSaysWhyNotThatItIsMissing) {
  TempDir dir;
  const fs::path loop = dir.path() / "loop";
  fs::create_symlink(loop, loop);
  for (const std::string dataset : {"fashion_mnist", "cifar10", "image_folder"}) {
    const std::string error =
        error_of(load_config("", {"data.dataset=" + dataset, "data.root=" + loop.string()}));
    EXPECT_NE(error.find("data.root: dataset directory '" + loop.string() +
                         "' cannot be read: Too many levels of symbolic links"),
              std::string::npos)
        << error;
    EXPECT_EQ(error.find("does not exist"), std::string::npos) << error;
    EXPECT_EQ(error.find("apt-get"), std::string::npos) << error;
  }
  // A file inside the root: the same.
  const fs::path root = dir.path() / "fm";
  fs::create_directories(root);
  const fs::path images = root / "train-images-idx3-ubyte";
  fs::create_symlink(images, images);
  std::string error = error_of(load_config("", {"data.dataset=fashion_mnist", "data.root=" + root.string()}));
  EXPECT_NE(error.find(images.string() + ": cannot be read: Too many levels of symbolic links"),
            std::string::npos)
      << error;
  EXPECT_EQ(error.find("apt-get"), std::string::npos) << error;
  // Really missing: the hint stays.
  fs::remove(images);
  error = error_of(load_config("", {"data.dataset=fashion_mnist", "data.root=" + root.string()}));
  EXPECT_NE(error.find("no such file. HINT: apt-get install dataset-fashion-mnist"), std::string::npos)
      << error;
}

TEST(DatasetFactory, APermissionDeniedDatasetDirectorySaysSo) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads directories whatever their permissions";
  TempDir dir;
  const fs::path locked = dir.path() / "locked";
  fs::create_directories(locked / "fm");
  fs::permissions(locked, fs::perms::none);
  for (const fs::path& root : {locked / "fm", locked}) {
    const std::string error =
        error_of(load_config("", {"data.dataset=fashion_mnist", "data.root=" + root.string()}));
    EXPECT_NE(error.find("Permission denied"), std::string::npos) << error;
    EXPECT_EQ(error.find("apt-get"), std::string::npos) << error;
  }
  fs::permissions(locked, fs::perms::owner_all);
}

// ---- sizes that cannot fit this host stop the run before anything is allocated (issue 30)

HostLimits small_host() {
  HostLimits host;
  host.available_memory = int64_t{1} << 30;  // 1 GiB
  host.cores = 2;
  return host;
}

// local_world_size: the node's ranks (as a launcher's LOCAL_WORLD_SIZE says).
std::string fit_error(const std::vector<std::string>& overrides, const HostLimits& host,
                      int local_world_size = 1) {
  const Config config = load_config("", overrides);
  try {
    // On this host: the sizes below fit any test machine.
    const Datasets data = open_datasets(config, local_world_size);
    check_data_fits_host(config, data, host, local_world_size);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

TEST(DataFitsHost, TooManyLoaderThreadsStopAtOnce) {
  // Was: 24 s of starting threads, then "Resource temporarily unavailable".
  std::string error = error_of(load_config("", {"data.dataset=synthetic", "data.workers=100000"}));
  EXPECT_NE(error.find("data.workers: is 100000, more loader threads than this host can run"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("HINT: set data.workers = -1"), std::string::npos) << error;
  EXPECT_EQ(max_loader_workers(small_host()), 64);
  HostLimits big = small_host();
  big.cores = 32;
  EXPECT_EQ(max_loader_workers(big), 256);
  big.max_user_threads = 100;  // RLIMIT_NPROC
  EXPECT_EQ(max_loader_workers(big), 50);
  error = fit_error({"data.dataset=synthetic", "data.workers=51"}, big);
  EXPECT_NE(error.find("at most 50 (8 per core on 32 cores, at least 64, and half of RLIMIT_NPROC (100))"),
            std::string::npos)
      << error;
  EXPECT_EQ(fit_error({"data.dataset=synthetic", "data.workers=50"}, big), "");
}

TEST(DataFitsHost, ABatchLargerThanTheTrainingSetIsRefusedWithoutDropLast) {
  // Was: one batch of all 50000 samples, std::bad_alloc in the first convolution after 17 s.
  const std::string error = error_of(
      load_config("", {"data.dataset=synthetic", "data.batch_size=1000000000", "data.drop_last=false"}));
  EXPECT_NE(error.find("data.batch_size: is 1000000000, larger than the 50000 samples of the training set "
                       "(synthetic): with data.drop_last = false"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("HINT: set data.batch_size to at most 50000"), std::string::npos) << error;
  // drop_last = true: the experiment's "leaves no optimizer step" error stays the one that says so.
  EXPECT_EQ(error_of(load_config("", {"data.dataset=synthetic", "data.batch_size=1000000000"})), "");
}

TEST(DataFitsHost, SampleIndicesMustFitInHalfTheAvailableMemory) {
  // Was: 100 s building a 1e9-entry permutation at 8 GB RSS. Here 1 GiB available: 2.1M training and
  // 0.42M test samples need 8 * (2 * 2.1M + 0.42M) = 37 MB, 40M and 8M need 704 MB > 512 MiB.
  const HostLimits host = small_host();
  EXPECT_EQ(fit_error({"data.dataset=synthetic", "data.synthetic_samples=2100000"}, host), "");
  const std::string error = fit_error({"data.dataset=synthetic", "data.synthetic_samples=40000000"}, host);
  EXPECT_NE(
      error.find("data.synthetic_samples: the 40000000 training and 8000000 test samples need 671.4 MiB of "
                 "sample indices"),
      std::string::npos)
      << error;
  EXPECT_NE(error.find("more than half of the 1.0 GiB of memory available on this host. HINT: lower "
                       "data.synthetic_samples"),
            std::string::npos)
      << error;
}

TEST(DataFitsHost, BatchesInFlightMustFitInHalfTheAvailableMemory) {
  const HostLimits host = small_host();
  // 32x32x3 = 3072 bytes a sample; prefetch 4 + 1 batches as uint8 and one as float32: 9 x 3072 bytes a
  // sample, so 512 MiB hold 19418 samples a batch.
  // One loader thread: data.workers = -1 would count this machine's cores.
  const std::vector<std::string> big = {"data.dataset=synthetic", "data.synthetic_samples=100000",
                                        "data.workers=1"};
  std::vector<std::string> overrides = big;
  overrides.push_back("data.batch_size=19000");
  EXPECT_EQ(fit_error(overrides, host), "");
  {
    // The node's ranks share the memory: at 2 local ranks each gets half of the budget.
    const std::string shared = fit_error(overrides, host, 2);
    EXPECT_NE(shared.find("more than half of the 1.0 GiB (shared by this node's 2 ranks)"), std::string::npos)
        << shared;
  }
  overrides.back() = "data.batch_size=20000";
  std::string error = fit_error(overrides, host);
  EXPECT_NE(error.find("data.batch_size: 5 batches of 20000 images of 32x32x3 in flight "
                       "and one as float32 need 527.3 MiB, more than half of the 1.0 GiB"),
            std::string::npos)
      << error;
  // The evaluation batch counts what the test split can fill (20000 samples here).
  overrides = big;
  overrides.push_back("data.eval_batch_size=1000000");
  error = fit_error(overrides, host);
  EXPECT_NE(error.find("data.eval_batch_size: 5 batches of 20000 images"), std::string::npos) << error;
  // Unknown memory: no memory checks.
  HostLimits unknown = host;
  unknown.available_memory = 0;
  EXPECT_EQ(fit_error(overrides, unknown), "");
}

}  // namespace
}  // namespace trainer
