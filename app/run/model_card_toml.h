#pragma once
// The model card (app/run/model_card.h) as the checkpoint manifest's [model_card] table: kept apart so
// that only the manifest's readers and writers include toml++.
#include <toml++/toml.h>

#include <optional>
#include <string>

#include "app/run/model_card.h"

namespace trainer {

toml::table model_card_toml(const ModelCard& card);
// None when the manifest has no [model_card] table (written before cards existed); a malformed one
// throws std::runtime_error naming `where`.
std::optional<ModelCard> model_card_from_manifest(const toml::table& manifest, const std::string& where);

}  // namespace trainer
