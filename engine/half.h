// half.h: exact conversions of IEEE binary16 (F16) and bfloat16 (BF16) to float, for the
// safetensors and GGUF readers. Every 16-bit value is exactly a float: subnormals, infinities and
// signed zeros convert without rounding; NaNs keep sign and payload. An F16 signaling NaN comes
// back quiet, as x86's F16C (vcvtph2ps) and PyTorch give it; BF16 is a plain shift, as PyTorch's.
#ifndef HALF_H
#define HALF_H

#include <stdint.h>
#include <string.h>

static inline float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// BF16 is the top half of a float.
static inline float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

// F16: sign 1, exponent 5 (bias 15), mantissa 10. Normal numbers rebias the exponent to 127;
// subnormals are mantissa * 2^-24, exact in float arithmetic (10 bits of mantissa).
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = h >> 10 & 0x1F, mant = h & 0x3FF;
    if (exp == 0x1F) return bits_to_f32(sign | 0x7F800000u | (mant ? 0x400000u : 0) | mant << 13);   // inf; NaN made quiet
    if (exp != 0) return bits_to_f32(sign | (exp + 127 - 15) << 23 | mant << 13);
    float sub = (float)mant * 0x1p-24f;   // zero or subnormal
    return sign ? -sub : sub;
}

#endif
