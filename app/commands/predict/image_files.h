#pragma once
// The files `trainer predict` classifies as a Dataset, so that the DataLoader's worker threads decode
// them in batches as in `trainer eval`: each sample is its file through the model card's evaluation
// transform (data/eval_crop.h). A file that cannot be read or decoded is left out of its batch
// (kDroppedSample), warned about once on stderr in data.bad_samples' words, and its problem kept
// for the output: one bad file never ends the others' predictions.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "app/run/model_card.h"
#include "data/bad_samples.h"
#include "data/dataset.h"

namespace trainer {

class ImageFiles : public Dataset {
 public:
  ImageFiles(std::vector<std::string> paths, const EvalTransform& transform, BadSampleWarn warn = {});

  std::string name() const override { return "predict inputs"; }
  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  int64_t num_classes() const override { return 0; }
  int64_t channels() const override { return transform_.channels; }
  int64_t height() const override { return transform_.crop; }
  int64_t width() const override { return transform_.crop; }
  const std::vector<std::string>& class_names() const override { return no_names_; }
  Normalization normalization() const override { return {transform_.mean, transform_.std}; }
  // Strict: throws DataError naming the file.
  void read_into(int64_t index, uint8_t* hwc_out) const override;
  int64_t label(int64_t index) const override { return index; }  // the label is the file's index
  // kDroppedSample for a bad file, whose problem() then says what is wrong.
  int64_t read_augmented(int64_t index, uint8_t* hwc_out, Generator& gen) const override;
  std::string fingerprint() const override { return describe(0); }

  const std::string& path(int64_t index) const { return paths_[static_cast<size_t>(index)]; }
  std::string problem(int64_t index) const;  // "" for a file that was read fine (or not yet)

 private:
  std::string try_load(int64_t index, uint8_t* hwc_out) const;  // "" or what is wrong

  std::vector<std::string> paths_;
  EvalTransform transform_;
  std::vector<std::string> no_names_;
  std::unique_ptr<BadSampleTracker> bad_;
  mutable std::mutex mutex_;
  mutable std::map<int64_t, std::string> problems_;
};

}  // namespace trainer
