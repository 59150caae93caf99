#pragma once
// The interface every dataset implements: a fixed number of uint8 images of one shape, stored
// height x width x channels (HWC, the layout of the files and of the batches), each with a label.
// Implementations are immutable after construction, so every read is safe from many threads at once.
#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

class Generator;  // nn/random.h

// What read_augmented returns, instead of a label, for a sample that cannot be read and that the
// dataset's policy leaves out rather than replaces: an evaluation split with bad_samples = "skip", where
// a replacement would count another image twice. The DataLoader drops such a sample from its batch and
// counts it (DataLoader::dropped_samples).
inline constexpr int64_t kDroppedSample = -1;

// Per-channel statistics of the pixels scaled to [0, 1], for to_float_normalized().
struct Normalization {
  std::vector<float> mean;
  std::vector<float> std;
};

struct Sample {
  std::vector<uint8_t> pixels;  // [H, W, C]
  int64_t label = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual std::string name() const = 0;  // e.g. "fashion-mnist/train", for logs and errors
  virtual int64_t size() const = 0;
  virtual int64_t num_classes() const = 0;
  virtual int64_t channels() const = 0;
  virtual int64_t height() const = 0;
  virtual int64_t width() const = 0;
  virtual const std::vector<std::string>& class_names() const = 0;
  virtual Normalization normalization() const = 0;

  // Copies sample `index`'s pixels into hwc_out (sample_bytes() bytes, [H, W, C]). The hot path of
  // the loader: no allocation. Throws std::out_of_range for an index outside [0, size()).
  virtual void read_into(int64_t index, uint8_t* hwc_out) const = 0;
  virtual int64_t label(int64_t index) const = 0;

  // What the DataLoader reads: sample `index` as this dataset presents it for training or evaluation,
  // drawing any randomness (a random resized crop, say) from gen, and the label of the pixels written.
  // That label is label(index) except when a dataset replaces an unreadable sample by another (see
  // BadSamplePolicy), or kDroppedSample when it leaves it out (then hwc_out holds nothing useful). The
  // default, for datasets stored at their final size, is read_into + label.
  virtual int64_t read_augmented(int64_t index, uint8_t* hwc_out, Generator& gen) const;
  // Samples replaced by another so far because their file could not be read (bad_samples = "skip"),
  // counted once per read: what trainer_bad_samples_total exports. Safe to call from any thread.
  virtual int64_t skipped_samples() const { return 0; }

  // A one-line summary of what was loaded: name, size, shape, classes and a content hash. Ranks
  // compare fingerprints at start-up so that a rank reading other files (another version, a
  // different root) fails loudly instead of silently training on different data.
  virtual std::string fingerprint() const = 0;

  int64_t sample_bytes() const { return channels() * height() * width(); }
  Sample get(int64_t index) const;

 protected:
  void check_index(int64_t index) const;
  // The parts of fingerprint() common to every dataset, followed by the dataset's own content hash.
  std::string describe(uint64_t content_hash) const;
};

}  // namespace trainer
