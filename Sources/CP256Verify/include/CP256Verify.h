#ifndef CP256VERIFY_H
#define CP256VERIFY_H

#include <stddef.h>
#include <stdint.h>

/// ES256 (ECDSA P-256, SHA-256) signature verification against a public key with a
/// precomputed table of its multiples, over BoringSSL's P-256 assembly (the copy swift-crypto
/// links into every binary). See P256Table.swift for why and how it is used.

/// 1 where the fast path exists (x86-64); 0 elsewhere (callers verify with swift-crypto).
int sk_p256_available(void);

/// Size in bytes of one point's table.
size_t sk_p256_table_size(void);

/// Fills `table` (sk_p256_table_size() bytes, 64-byte aligned) for the point (x, y), each
/// 32 bytes big-endian. Returns 0 (and leaves nothing usable) unless the point is on P-256.
int sk_p256_table_init(void *table, const uint8_t x[32], const uint8_t y[32]);

/// The table of the curve's generator; built on first use, thread-safe.
const void *sk_p256_base_table(void);

/// 1 if (r, s) (64 bytes, big-endian halves) is a valid ECDSA signature of `digest` (32
/// bytes, big-endian: the SHA-256 of the signed data) under the key of `table`; else 0.
int sk_p256_verify(const void *table, const uint8_t digest[32], const uint8_t signature[64]);

/// Tests: 0 makes every later call use the assembly for CPUs without BMI2 and ADX, 1 the
/// one for CPUs with them (only where the CPU has them), -1 chooses by the CPU again.
void sk_p256_select_assembly(int adx);

/// Scalar arithmetic modulo the group order, 32-byte big-endian values below the order, for
/// tests that construct signatures on purpose (a doubling, the point at infinity).
int sk_p256_scalar_mul(uint8_t out[32], const uint8_t a[32], const uint8_t b[32]);
int sk_p256_scalar_inverse(uint8_t out[32], const uint8_t a[32]);
int sk_p256_scalar_negate(uint8_t out[32], const uint8_t a[32]);

#endif
