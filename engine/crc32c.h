/* CRC32C (Castagnoli), the checksum of the disk tier's slots (kv_disk.h): the SSE4.2
 * crc32 instruction where the CPU has it (a block of a few MB in well under a
 * millisecond), else a byte table; both give the same value. */
#ifndef KVG_CRC32C_H
#define KVG_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes. crc32c("123456789") == 0xe3069283. */
uint32_t kvg_crc32c(uint32_t crc, const void *data, size_t n);

#endif
