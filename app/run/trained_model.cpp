#include "app/run/trained_model.h"

#include <stdexcept>

#include "app/run/experiment.h"

namespace trainer {

TrainedModel load_trained_model(const Config& config, const std::string& weights_path,
                                const RunDevice& device, CrcCheck crc_check, int local_world_size) {
  TrainedModel t;
  // Read once: the card, the CRC-32Cs and the tensors all come from this copy.
  SafetensorsFile weights = read_safetensors(weights_path);
  if (std::optional<ModelCard> card = read_model_card(weights)) {
    t.card = std::move(*card);
    const EvalTransform& tf = t.card.transform;
    t.options =
        model_options_for(config, tf.channels, static_cast<int64_t>(t.card.class_names.size()), tf.crop);
    try {
      t.model = create_model(t.options);
    } catch (const std::invalid_argument& err) {
      throw config_error_at(config, "model.name", err.what());
    }
    t.model->to(device.device);
    // A channels-last network keeps its convolution weights channels-last too, as build_experiment does.
    if (device.precision.input_format == MemoryFormat::channels_last)
      t.model->to(MemoryFormat::channels_last);
  } else {
    // No card: the shape, transform and normalisation the run had come from its dataset, as in `eval`.
    Experiment e = build_experiment(config, device, false, 1, 0, local_world_size);
    t.card = model_card_of(e);
    t.card.class_names.clear();
    t.options = model_options_for(config, e.data.train->channels(), e.data.train->num_classes(),
                                  e.data.train->height());
    t.model = e.model;
    t.no_card_reason = weights_path +
                       " carries no class names (written before trainer stored them with the weights, or "
                       "not by trainer): classes are shown by their index";
  }
  t.weights_note = load_weights(std::move(weights), *t.model, crc_check);
  t.model->eval();
  return t;
}

}  // namespace trainer
