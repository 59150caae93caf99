#pragma once
// CRC-32C (Castagnoli), the checksum checkpoints carry per tensor and per file to detect corruption.
#include <cstddef>
#include <cstdint>
#include <string>

namespace trainer {

uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// CRC-32C of a whole file; throws std::runtime_error naming the file when it cannot be read.
uint32_t crc32c_file(const std::string& path);
std::string crc32c_hex(uint32_t crc);

}  // namespace trainer
