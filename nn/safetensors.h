#pragma once
// Reading and writing safetensors files (the Hugging Face format PyTorch users exchange weights in):
//   8-byte little-endian header length N | N bytes of JSON header | data section
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data section; tensors packed back to back) plus an optional "__metadata__" object
// of string to string. Supported dtypes: F32, F64, F16, BF16, I64, U8.
//
// Writes are atomic (temp file in the same directory, fsync, rename), so a crash never leaves a
// half-written checkpoint under the final name. Reads are strict: anything malformed or inconsistent
// throws std::runtime_error naming the file and, where one is involved, the tensor.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/modules/module.h"
#include "nn/tensor.h"

namespace trainer {

using SafetensorsMetadata = std::map<std::string, std::string>;

// Tensors are stored in the given order; device or non-contiguous tensors are copied to contiguous
// host memory first. Names must be unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const SafetensorsMetadata& metadata = {});
// All tensors of the file (host, contiguous) by name; the metadata too when `metadata` is given.
std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               SafetensorsMetadata* metadata = nullptr);

// A file read once, whole, for readers that each need part of it (`trainer predict` and `export`: the
// model card in the metadata, the CRC-32Cs, the tensors).
struct SafetensorsFile {
  std::string path;  // for messages
  std::map<std::string, Tensor> tensors;
  SafetensorsMetadata metadata;
};
SafetensorsFile read_safetensors(const std::string& path);

// A module's parameters and buffers under their dotted state-dict names, in PyTorch's order.
void save_module(const std::string& path, Module& module, const SafetensorsMetadata& metadata = {});
// What load_module filled in itself rather than read from the file.
struct ModuleLoadReport {
  // BatchNorm step counters ("*.num_batches_tracked") absent from the file, set to 0: torchvision's
  // exports often leave them out, and they only matter for BatchNorm's momentum=None mode.
  std::vector<std::string> counters_set_to_zero;
  // Tensors of another shape that the model converted to its own (Module::adapt_loaded_tensor), one
  // line each: "encoder.pos_embedding [1, 197, 768] -> [1, 65, 768]".
  std::vector<std::string> adapted;
  // One line for the log, "" when nothing was filled in.
  std::string note(const std::string& path) const;
};

// Loads a file written by save_module (or torchvision's state_dict saved with safetensors) into
// `module`. Strict: every tensor of the module must be in the file with the same dtype and shape and
// the file must hold nothing else; the module is left untouched when any check fails. The exceptions,
// listed in the report: a missing num_batches_tracked counter, set to 0, and a tensor of another shape
// that the module converts to its own (a ViT's position embedding for another image size).
ModuleLoadReport load_module(const std::string& path, Module& module);
// The same from a file already read (read_safetensors).
ModuleLoadReport load_module(SafetensorsFile file, Module& module);

// Safetensors' dtype names ("F32", "BF16", ...).
std::string safetensors_dtype_name(DType dtype);

}  // namespace trainer
