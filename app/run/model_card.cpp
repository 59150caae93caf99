#include "app/run/model_card.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "app/run/experiment.h"
#include "app/run/model_card_toml.h"
#include "data/image_folder.h"
#include "data/resized_crop.h"

namespace trainer {
namespace {

constexpr const char* kClassNamesKey = "trainer.class_names";
constexpr const char* kTransformKey = "trainer.eval_transform";

nlohmann::json transform_json(const EvalTransform& t) {
  return {{"resize", t.resize}, {"crop", t.crop}, {"channels", t.channels}, {"mean", t.mean}, {"std", t.std}};
}

// Checks what a loaded card must satisfy before a model is built from it.
void check_card(const ModelCard& card, const std::string& where) {
  const EvalTransform& t = card.transform;
  const auto stats_fit = [&](const std::vector<float>& v) {
    return v.size() == 1 || static_cast<int64_t>(v.size()) == t.channels;
  };
  if (card.class_names.empty() || t.crop < 1 || t.resize < t.crop || (t.channels != 1 && t.channels != 3) ||
      !stats_fit(t.mean) || t.std.size() != t.mean.size())
    throw std::runtime_error(where +
                             ": malformed model card (class names, eval transform: resize >= crop >= 1, "
                             "channels 1 or 3, one mean and std per channel)");
}

}  // namespace

ModelCard model_card_of(const Dataset& eval_split, const Normalization& normalization) {
  ModelCard card;
  card.class_names = eval_split.class_names();
  EvalTransform& t = card.transform;
  t.crop = eval_split.height();
  t.channels = eval_split.channels();
  // Image folders are resized then centre-cropped (data/resized_crop.h); other datasets are stored at
  // the model's size, so a picture of another size is resized to it.
  t.resize = dynamic_cast<const ImageFolder*>(&eval_split) ? eval_resize_size(t.crop) : t.crop;
  t.mean = normalization.mean;
  t.std = normalization.std;
  if (t.mean.empty()) {  // no normalisation: the identity
    t.mean = {0.0f};
    t.std = {1.0f};
  }
  return card;
}

ModelCard model_card_of(const Experiment& e) { return model_card_of(*e.data.test, e.normalization); }

SafetensorsMetadata model_card_metadata(const ModelCard& card) {
  // A class name that is not UTF-8 (a directory name) must not lose the card: such bytes become U+FFFD.
  const auto replace = nlohmann::json::error_handler_t::replace;
  return {{kClassNamesKey, nlohmann::json(card.class_names).dump(-1, ' ', false, replace)},
          {kTransformKey, transform_json(card.transform).dump()}};
}

std::optional<ModelCard> model_card_from_metadata(const SafetensorsMetadata& metadata,
                                                  const std::string& where) {
  const auto names = metadata.find(kClassNamesKey), transform = metadata.find(kTransformKey);
  if (names == metadata.end() && transform == metadata.end()) return std::nullopt;
  if (names == metadata.end() || transform == metadata.end())
    throw std::runtime_error(where + ": model card incomplete (needs both " + kClassNamesKey + " and " +
                             kTransformKey + ")");
  ModelCard card;
  try {
    card.class_names = nlohmann::json::parse(names->second).get<std::vector<std::string>>();
    const nlohmann::json t = nlohmann::json::parse(transform->second);
    card.transform = {t.at("resize").get<int64_t>(), t.at("crop").get<int64_t>(),
                      t.at("channels").get<int64_t>(), t.at("mean").get<std::vector<float>>(),
                      t.at("std").get<std::vector<float>>()};
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(where + ": malformed model card: " + e.what());
  }
  check_card(card, where);
  return card;
}

toml::table model_card_toml(const ModelCard& card) {
  toml::array names, mean, std;
  for (const std::string& n : card.class_names) names.push_back(n);
  for (float m : card.transform.mean) mean.push_back(static_cast<double>(m));
  for (float s : card.transform.std) std.push_back(static_cast<double>(s));
  return toml::table{{"class_names", names},
                     {"resize", card.transform.resize},
                     {"crop", card.transform.crop},
                     {"channels", card.transform.channels},
                     {"mean", mean},
                     {"std", std}};
}

std::optional<ModelCard> model_card_from_manifest(const toml::table& manifest, const std::string& where) {
  const toml::table* t = manifest["model_card"].as_table();
  if (!t) return std::nullopt;
  ModelCard card;
  const auto floats = [](const toml::node_view<const toml::node> node) {
    std::vector<float> out;
    if (const toml::array* a = node.as_array())
      for (const toml::node& v : *a) out.push_back(static_cast<float>(v.value_or(0.0)));
    return out;
  };
  if (const toml::array* names = (*t)["class_names"].as_array())
    for (const toml::node& n : *names) card.class_names.push_back(n.value_or(std::string()));
  card.transform = {(*t)["resize"].value_or(int64_t{0}), (*t)["crop"].value_or(int64_t{0}),
                    (*t)["channels"].value_or(int64_t{0}), floats((*t)["mean"]), floats((*t)["std"])};
  check_card(card, where + ": [model_card]");
  return card;
}

std::optional<ModelCard> read_model_card(const std::string& weights_path) {
  return read_model_card(read_safetensors(weights_path));
}

std::optional<ModelCard> read_model_card(const SafetensorsFile& weights) {
  if (auto card = model_card_from_metadata(weights.metadata, weights.path)) return card;
  const std::filesystem::path manifest =
      std::filesystem::path(weights.path).parent_path() / "checkpoint.toml";
  std::error_code error;
  if (!std::filesystem::is_regular_file(manifest, error)) return std::nullopt;
  try {
    return model_card_from_manifest(toml::parse_file(manifest.string()), manifest.string());
  } catch (const toml::parse_error& e) {
    throw std::runtime_error(manifest.string() + ": unreadable manifest: " + std::string(e.description()));
  }
}

}  // namespace trainer
