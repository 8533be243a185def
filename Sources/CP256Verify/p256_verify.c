#include "CP256Verify.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && !defined(_WIN32)
#include <cpuid.h>
#define SK_P256_FAST 1
#endif

#ifdef SK_P256_FAST

typedef uint64_t limb;

// BoringSSL's P-256 types: Jacobian coordinates in the Montgomery domain, 4 limbs each,
// least significant first. The point at infinity has Z = 0.
typedef struct {
  limb X[4];
  limb Y[4];
  limb Z[4];
} point;

// BoringSSL's P-256 assembly (crypto/fipsmodule/ec/p256-nistz.h), as swift-crypto builds it
// into CCryptoBoringSSL: hidden symbols of the same link, one variant for CPUs with
// BMI2 + ADX and one for the rest. point_add handles every case (a doubling, an operand or a
// result at infinity); all functions may work in place.
void CCryptoBoringSSL_ecp_nistz256_mul_mont_adx(limb r[4], const limb a[4], const limb b[4]);
void CCryptoBoringSSL_ecp_nistz256_mul_mont_nohw(limb r[4], const limb a[4], const limb b[4]);
void CCryptoBoringSSL_ecp_nistz256_sqr_mont_adx(limb r[4], const limb a[4]);
void CCryptoBoringSSL_ecp_nistz256_sqr_mont_nohw(limb r[4], const limb a[4]);
void CCryptoBoringSSL_ecp_nistz256_ord_mul_mont_adx(limb r[4], const limb a[4], const limb b[4]);
void CCryptoBoringSSL_ecp_nistz256_ord_mul_mont_nohw(limb r[4], const limb a[4], const limb b[4]);
void CCryptoBoringSSL_ecp_nistz256_point_double_adx(point *r, const point *a);
void CCryptoBoringSSL_ecp_nistz256_point_double_nohw(point *r, const point *a);
void CCryptoBoringSSL_ecp_nistz256_point_add_adx(point *r, const point *a, const point *b);
void CCryptoBoringSSL_ecp_nistz256_point_add_nohw(point *r, const point *a, const point *b);
int CCryptoBoringSSL_beeu_mod_inverse_vartime(limb out[4], const limb a[4], const limb n[4]);

// The field prime p and the group order n.
static const limb P[4] = {0xffffffffffffffff, 0x00000000ffffffff, 0x0000000000000000, 0xffffffff00000001};
static const limb N[4] = {0xf3b9cac2fc632551, 0xbce6faada7179e84, 0xffffffffffffffff, 0xffffffff00000000};
// 2^512 mod p and mod n: multiplied in, they move a value into the Montgomery domain.
static const limb RR_P[4] = {0x0000000000000003, 0xfffffffbffffffff, 0xfffffffffffffffe, 0x00000004fffffffd};
static const limb RR_N[4] = {0x83244c95be79eea2, 0x4699799c49bd6fa6, 0x2845b2392b6bec59, 0x66e12d94f3d95620};
// 1 in the Montgomery domain (2^256 mod p), and 1 as it is (multiplied in, it moves a value out).
static const limb ONE_MONT[4] = {0x0000000000000001, 0xffffffff00000000, 0xffffffffffffffff, 0x00000000fffffffe};
static const limb ONE[4] = {1, 0, 0, 0};
// The curve's b, and its generator.
static const uint8_t B_BYTES[32] = {0x5a, 0xc6, 0x35, 0xd8, 0xaa, 0x3a, 0x93, 0xe7, 0xb3, 0xeb, 0xbd,
                                    0x55, 0x76, 0x98, 0x86, 0xbc, 0x65, 0x1d, 0x06, 0xb0, 0xcc, 0x53,
                                    0xb0, 0xf6, 0x3b, 0xce, 0x3c, 0x3e, 0x27, 0xd2, 0x60, 0x4b};
static const uint8_t GX[32] = {0x6b, 0x17, 0xd1, 0xf2, 0xe1, 0x2c, 0x42, 0x47, 0xf8, 0xbc, 0xe6,
                               0xe5, 0x63, 0xa4, 0x40, 0xf2, 0x77, 0x03, 0x7d, 0x81, 0x2d, 0xeb,
                               0x33, 0xa0, 0xf4, 0xa1, 0x39, 0x45, 0xd8, 0x98, 0xc2, 0x96};
static const uint8_t GY[32] = {0x4f, 0xe3, 0x42, 0xe2, 0xfe, 0x1a, 0x7f, 0x9b, 0x8e, 0xe7, 0xeb,
                               0x4a, 0x7c, 0x0f, 0x9e, 0x16, 0x2b, 0xce, 0x33, 0x57, 0x6b, 0x31,
                               0x5e, 0xce, 0xcb, 0xb6, 0x40, 0x68, 0x37, 0xbf, 0x51, 0xf5};

// A table holds, for each of the 32 bytes of a scalar (window w) and each value d = 1…255 of
// that byte, the point d · 2^(8w) · Q: a scalar multiple of Q is then at most 32 additions.
enum { WINDOWS = 32, ENTRIES = 255 };

static int adx = -1;

static int use_adx(void) {
  int cached = __atomic_load_n(&adx, __ATOMIC_RELAXED);
  if (cached >= 0) return cached;
  unsigned a = 0, b = 0, c = 0, d = 0;
  // The same test as BoringSSL's: BMI2 (leaf 7, EBX bit 8) and ADX (bit 19).
  int capable = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 8)) && (b & (1u << 19));
  __atomic_store_n(&adx, capable ? 1 : 0, __ATOMIC_RELAXED);
  return capable;
}

void sk_p256_select_assembly(int choice) {
  __atomic_store_n(&adx, -1, __ATOMIC_RELAXED);
  if (choice == 0 || (choice == 1 && use_adx())) __atomic_store_n(&adx, choice, __ATOMIC_RELAXED);
}

static void mul_mont(limb r[4], const limb a[4], const limb b[4]) {
  if (use_adx()) CCryptoBoringSSL_ecp_nistz256_mul_mont_adx(r, a, b);
  else CCryptoBoringSSL_ecp_nistz256_mul_mont_nohw(r, a, b);
}

static void sqr_mont(limb r[4], const limb a[4]) {
  if (use_adx()) CCryptoBoringSSL_ecp_nistz256_sqr_mont_adx(r, a);
  else CCryptoBoringSSL_ecp_nistz256_sqr_mont_nohw(r, a);
}

static void ord_mul_mont(limb r[4], const limb a[4], const limb b[4]) {
  if (use_adx()) CCryptoBoringSSL_ecp_nistz256_ord_mul_mont_adx(r, a, b);
  else CCryptoBoringSSL_ecp_nistz256_ord_mul_mont_nohw(r, a, b);
}

static void point_double(point *r, const point *a) {
  if (use_adx()) CCryptoBoringSSL_ecp_nistz256_point_double_adx(r, a);
  else CCryptoBoringSSL_ecp_nistz256_point_double_nohw(r, a);
}

static void point_add(point *r, const point *a, const point *b) {
  if (use_adx()) CCryptoBoringSSL_ecp_nistz256_point_add_adx(r, a, b);
  else CCryptoBoringSSL_ecp_nistz256_point_add_nohw(r, a, b);
}

static void from_bytes(limb out[4], const uint8_t in[32]) {
  for (int i = 0; i < 4; i++) {
    limb word = 0;
    for (int j = 0; j < 8; j++) word = (word << 8) | in[(3 - i) * 8 + j];
    out[i] = word;
  }
}

static void to_bytes(uint8_t out[32], const limb in[4]) {
  for (int i = 0; i < 4; i++) {
    for (int j = 0; j < 8; j++) out[(3 - i) * 8 + j] = (uint8_t)(in[i] >> (8 * (7 - j)));
  }
}

static int less_than(const limb a[4], const limb b[4]) {
  for (int i = 3; i >= 0; i--) {
    if (a[i] != b[i]) return a[i] < b[i];
  }
  return 0;
}

static int is_zero(const limb a[4]) { return (a[0] | a[1] | a[2] | a[3]) == 0; }

static int equal(const limb a[4], const limb b[4]) {
  return ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3])) == 0;
}

// r = a + b, returning the carry out.
static limb add_words(limb r[4], const limb a[4], const limb b[4]) {
  unsigned __int128 carry = 0;
  for (int i = 0; i < 4; i++) {
    carry += (unsigned __int128)a[i] + b[i];
    r[i] = (limb)carry;
    carry >>= 64;
  }
  return (limb)carry;
}

// r = a - b, returning the borrow out.
static limb sub_words(limb r[4], const limb a[4], const limb b[4]) {
  limb borrow = 0;
  for (int i = 0; i < 4; i++) {
    limb difference = a[i] - b[i];
    limb next = (a[i] < b[i]) | (difference < borrow);
    r[i] = difference - borrow;
    borrow = next;
  }
  return borrow;
}

// Modulo p, for inputs below p.
static void add_mod_p(limb r[4], const limb a[4], const limb b[4]) {
  limb carry = add_words(r, a, b);
  if (carry || !less_than(r, P)) sub_words(r, r, P);
}

static void sub_mod_p(limb r[4], const limb a[4], const limb b[4]) {
  if (sub_words(r, a, b)) add_words(r, r, P);
}

// y² = x³ − 3x + b, for x and y (below p) in the Montgomery domain.
static int on_curve(const limb x[4], const limb y[4]) {
  limb b[4], left[4], right[4], three_x[4];
  from_bytes(b, B_BYTES);
  mul_mont(b, b, RR_P);
  sqr_mont(left, y);
  sqr_mont(right, x);
  mul_mont(right, right, x);
  add_mod_p(three_x, x, x);
  add_mod_p(three_x, three_x, x);
  sub_mod_p(right, right, three_x);
  add_mod_p(right, right, b);
  return equal(left, right);
}

int sk_p256_available(void) { return 1; }

size_t sk_p256_table_size(void) { return sizeof(point) * WINDOWS * ENTRIES; }

int sk_p256_table_init(void *table, const uint8_t x[32], const uint8_t y[32]) {
  __attribute__((aligned(32))) point base;
  limb xs[4], ys[4];
  from_bytes(xs, x);
  from_bytes(ys, y);
  if (!less_than(xs, P) || !less_than(ys, P)) return 0;
  mul_mont(base.X, xs, RR_P);
  mul_mont(base.Y, ys, RR_P);
  memcpy(base.Z, ONE_MONT, sizeof(base.Z));
  if (!on_curve(base.X, base.Y)) return 0;
  point *rows = (point *)table;
  for (int w = 0; w < WINDOWS; w++) {
    point *row = rows + w * ENTRIES;
    row[0] = base;  // 1 · 2^(8w) · Q
    point_double(&row[1], &base);
    for (int d = 3; d <= ENTRIES; d++) point_add(&row[d - 1], &row[d - 2], &base);
    // 2^(8(w+1)) · Q is 128 · 2^(8w) · Q doubled.
    if (w + 1 < WINDOWS) point_double(&base, &row[127]);
  }
  return 1;
}

static void *base_table;
static pthread_once_t base_once = PTHREAD_ONCE_INIT;

static void build_base_table(void) {
  void *table = NULL;
  if (posix_memalign(&table, 64, sk_p256_table_size()) != 0) return;
  if (!sk_p256_table_init(table, GX, GY)) {
    free(table);
    return;
  }
  base_table = table;
}

const void *sk_p256_base_table(void) {
  pthread_once(&base_once, build_base_table);
  return base_table;
}

// acc += u · Q, u below n, with Q's table; `have` says whether acc holds a point yet.
static void accumulate(point *acc, int *have, const point *table, const limb u[4]) {
  for (int w = 0; w < WINDOWS; w++) {
    unsigned digit = (unsigned)(u[w / 8] >> (8 * (w % 8))) & 0xff;
    if (digit == 0) continue;
    const point *entry = table + w * ENTRIES + (digit - 1);
    if (*have) {
      point_add(acc, acc, entry);
    } else {
      *acc = *entry;
      *have = 1;
    }
  }
}

// SEC 1 / FIPS 186-4 ECDSA verification: r and s in [1, n−1]; w = s⁻¹; u1 = e·w, u2 = r·w;
// R = u1·G + u2·Q not at infinity; R's x coordinate reduced modulo n equals r.
int sk_p256_verify(const void *table, const uint8_t digest[32], const uint8_t signature[64]) {
  const point *generator = (const point *)sk_p256_base_table();
  if (table == NULL || generator == NULL) return 0;
  limb r[4], s[4], e[4], w[4], u1[4], u2[4], t[4];
  from_bytes(r, signature);
  from_bytes(s, signature + 32);
  from_bytes(e, digest);
  if (is_zero(r) || is_zero(s) || !less_than(r, N) || !less_than(s, N)) return 0;
  if (!less_than(e, N)) sub_words(e, e, N);  // e < 2^256 < 2n
  if (!CCryptoBoringSSL_beeu_mod_inverse_vartime(w, s, N)) return 0;
  // ord_mul_mont(a, b) is a·b·2^-256; a second product with 2^512 gives a·b.
  ord_mul_mont(t, e, w);
  ord_mul_mont(u1, t, RR_N);
  ord_mul_mont(t, r, w);
  ord_mul_mont(u2, t, RR_N);
  __attribute__((aligned(32))) point sum;
  int have = 0;
  accumulate(&sum, &have, generator, u1);
  accumulate(&sum, &have, (const point *)table, u2);
  if (!have || is_zero(sum.Z)) return 0;
  // x = X / Z²: compare X with r·Z² (and with (r + n)·Z² when r + n < p), out of the
  // Montgomery domain: mul_mont(r, Z²·2^256) is r·Z².
  limb z2[4], rz2[4], x[4], rn[4];
  sqr_mont(z2, sum.Z);
  mul_mont(rz2, r, z2);
  mul_mont(x, sum.X, ONE);
  if (equal(rz2, x)) return 1;
  if (add_words(rn, r, N) == 0 && less_than(rn, P)) {
    mul_mont(rz2, rn, z2);
    if (equal(rz2, x)) return 1;
  }
  return 0;
}

int sk_p256_scalar_mul(uint8_t out[32], const uint8_t a[32], const uint8_t b[32]) {
  limb x[4], y[4], t[4];
  from_bytes(x, a);
  from_bytes(y, b);
  if (!less_than(x, N) || !less_than(y, N)) return 0;
  ord_mul_mont(t, x, y);
  ord_mul_mont(t, t, RR_N);
  to_bytes(out, t);
  return 1;
}

int sk_p256_scalar_inverse(uint8_t out[32], const uint8_t a[32]) {
  limb x[4], inverse[4];
  from_bytes(x, a);
  if (is_zero(x) || !less_than(x, N)) return 0;
  if (!CCryptoBoringSSL_beeu_mod_inverse_vartime(inverse, x, N)) return 0;
  to_bytes(out, inverse);
  return 1;
}

int sk_p256_scalar_negate(uint8_t out[32], const uint8_t a[32]) {
  limb x[4], negated[4] = {0, 0, 0, 0};
  from_bytes(x, a);
  if (!less_than(x, N)) return 0;
  if (!is_zero(x)) sub_words(negated, N, x);
  to_bytes(out, negated);
  return 1;
}

#else

int sk_p256_available(void) { return 0; }
void sk_p256_select_assembly(int adx) {}
size_t sk_p256_table_size(void) { return 0; }
int sk_p256_table_init(void *table, const uint8_t x[32], const uint8_t y[32]) { return 0; }
const void *sk_p256_base_table(void) { return NULL; }
int sk_p256_verify(const void *table, const uint8_t digest[32], const uint8_t signature[64]) { return 0; }
int sk_p256_scalar_mul(uint8_t out[32], const uint8_t a[32], const uint8_t b[32]) { return 0; }
int sk_p256_scalar_inverse(uint8_t out[32], const uint8_t a[32]) { return 0; }
int sk_p256_scalar_negate(uint8_t out[32], const uint8_t a[32]) { return 0; }

#endif
