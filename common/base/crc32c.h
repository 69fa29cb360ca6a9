// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every KV chunk a
// migration sends. SSE4.2's crc32 instruction where the build targets it, a table otherwise;
// both give the same value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace riskkv {

// Extends `crc` (the value for the bytes before `data`; 0 to start) over `data`.
uint32_t Crc32cExtend(uint32_t crc, std::span<const uint8_t> data);

inline uint32_t Crc32c(std::span<const uint8_t> data) { return Crc32cExtend(0, data); }

// The table implementation alone, to check the hardware path against it.
uint32_t Crc32cExtendPortable(uint32_t crc, std::span<const uint8_t> data);

}  // namespace riskkv
