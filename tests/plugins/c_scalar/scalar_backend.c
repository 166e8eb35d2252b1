/* A backend plugin in plain C11, device kind "cscalar": the example of
 * docs/backends.md and the proof that the ABI (include/pagellm_backend.h)
 * needs nothing of pagellm's. It links against libc and libm only.
 *
 * Scalar code on the host: F32, F16 and BF16 weights (kept as uploaded;
 * vectors converted to F32), an F32 or F16 paged KV cache, the core ops,
 * RoPE with YaRN, attention with GQA, sliding window, softcap, sinks and
 * evicted keys, the softcap op, host swap. No Mixture-of-Experts, no sample
 * op: supports_op says so and the core does without them. Sums are in double.
 *
 * Built three times by the tests: as it is, and with PGLB_TEST_BAD_ABI or
 * PGLB_TEST_SMALL_STRUCT, which the loader must refuse by name. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagellm_backend.h"

#define KIND "cscalar"
#define PI 3.14159265358979323846

struct pglb_buffer {
  pglb_dtype dtype;
  size_t count, bytes;
  unsigned char* data;
};

struct pglb_weight {
  pglb_dtype type;  /* as held */
  int64_t rows, cols;
  size_t bytes;
  void* data;
};

struct pglb_stream {
  pglb_device* dev;
};

struct pglb_event {
  int unused;  /* ops run as they are enqueued: an event is always complete */
};

struct pglb_device {
  char error[512];
  pglb_batch batch;       /* the caller keeps its arrays until the next set_batch */
  pglb_kv_spec kv;
  int has_kv;
  size_t kv_layer_elems;  /* elements of one layer's K (or V) */
  unsigned char* kv_data; /* per layer: K then V */
  unsigned char* swap_data;
  int32_t swap_blocks;
};

/* ---- errors: the message stays in the device for last_error */

static pglb_status failf(pglb_device* d, pglb_status st, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->error, sizeof d->error, fmt, ap);
  va_end(ap);
  return st;
}

/* ---- element types */

static float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t x;
  float f;
  if (e == 0) {
    f = ldexpf((float)m, -24);  /* zero or subnormal */
    return sign ? -f : f;
  }
  x = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  memcpy(&f, &x, sizeof f);
  return f;
}

/* Rounds to the nearest half, ties to even. */
static uint16_t f32_to_f16(float f) {
  uint32_t x, m, e, half, rem, mid, shift;
  int32_t ne;
  uint16_t sign;
  memcpy(&x, &f, sizeof x);
  sign = (uint16_t)((x >> 16) & 0x8000u);
  e = (x >> 23) & 0xffu;
  m = x & 0x7fffffu;
  if (e == 0xff) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u : 0u));
  ne = (int32_t)e - 112;
  if (ne >= 31) return (uint16_t)(sign | 0x7c00u);
  if (ne <= 0) {
    if (ne < -10) return sign;
    m |= 0x800000u;
    shift = (uint32_t)(14 - ne);
    half = m >> shift;
    rem = m & ((1u << shift) - 1u);
    mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return (uint16_t)(sign | half);
  }
  half = ((uint32_t)ne << 10) | (m >> 13);
  rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  /* a carry moves into the exponent, as it should */
  return (uint16_t)(sign | half);
}

static float bf16_to_f32(uint16_t b) {
  const uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

static size_t type_size(pglb_dtype t) {
  switch (t) {
    case PGLB_F32: case PGLB_I32: return 4;
    case PGLB_F16: case PGLB_BF16: return 2;
    default: return 0;
  }
}

static int is_float_weight(pglb_dtype t) { return t == PGLB_F32 || t == PGLB_F16 || t == PGLB_BF16; }

/* Row r of a weight as floats. */
static void weight_row(const pglb_weight* w, int64_t r, float* out) {
  int64_t c;
  const size_t at = (size_t)(r * w->cols);
  if (w->type == PGLB_F32) {
    memcpy(out, (const float*)w->data + at, (size_t)w->cols * sizeof(float));
  } else if (w->type == PGLB_F16) {
    const uint16_t* p = (const uint16_t*)w->data + at;
    for (c = 0; c < w->cols; ++c) out[c] = f16_to_f32(p[c]);
  } else {
    const uint16_t* p = (const uint16_t*)w->data + at;
    for (c = 0; c < w->cols; ++c) out[c] = bf16_to_f32(p[c]);
  }
}

static float* f32(const pglb_buffer* b) { return (float*)b->data; }

/* Buffers an op reads or writes must be F32 and hold `elems` values. */
static int check_buffer(pglb_device* d, const pglb_buffer* b, int64_t elems, const char* what) {
  if (!b) return failf(d, PGLB_INVALID_ARGUMENT, "%s: a null buffer", what), 0;
  if (b->dtype != PGLB_F32) return failf(d, PGLB_INVALID_ARGUMENT, "%s: not an F32 buffer", what), 0;
  if (elems < 0 || (uint64_t)elems > b->count)
    return failf(d, PGLB_INVALID_ARGUMENT, "%s: %lld values needed, the buffer holds %zu", what, (long long)elems,
                 b->count), 0;
  return 1;
}

/* ---- the registry's device: one, on the host */

static int32_t device_count(const pglb_registry* reg) {
  (void)reg;
  return 1;
}

static void get_memory(size_t* total, size_t* avail) {
  char line[256];
  unsigned long long kb;
  FILE* f = fopen("/proc/meminfo", "r");
  *total = *avail = (size_t)1 << 30;  /* a guess when there is no /proc */
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) *total = (size_t)kb * 1024u;
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *avail = (size_t)kb * 1024u;
  }
  fclose(f);
}

static pglb_status device_open(const pglb_registry* reg, int32_t index, const pglb_options* options,
                               pglb_device** out, char* error, size_t error_len) {
  size_t i;
  pglb_device* d;
  (void)reg;
  if (index != 0) {
    snprintf(error, error_len, "the " KIND " backend has one device, not %d", (int)index);
    return PGLB_INVALID_ARGUMENT;
  }
  for (i = 0; options && i < options->count; ++i) {
    snprintf(error, error_len, "the " KIND " backend has no option '%s' (its options: none)", options->keys[i]);
    return PGLB_INVALID_ARGUMENT;
  }
  d = (pglb_device*)calloc(1, sizeof *d);
  if (!d) {
    snprintf(error, error_len, "out of memory");
    return PGLB_OUT_OF_MEMORY;
  }
  *out = d;
  return PGLB_OK;
}

static void device_close(pglb_device* d) {
  free(d->kv_data);
  free(d->swap_data);
  free(d);
}

static const char* describe(pglb_device* d) {
  (void)d;
  return KIND ": plain C11 scalar code on the host (test plugin)";
}

static const char* last_error(pglb_device* d) { return d->error; }

static pglb_status memory_info(pglb_device* d, pglb_memory_info* out) {
  pglb_memory_info m;
  (void)d;
  memset(&m, 0, sizeof m);
  get_memory(&m.total_bytes, &m.free_bytes);
  m.host_memory = 1;
  m.struct_size = out->struct_size < sizeof m ? out->struct_size : sizeof m;
  memcpy(out, &m, m.struct_size);
  return PGLB_OK;
}

static uint64_t features(pglb_device* d) {
  (void)d;
  return PGLB_FEATURE_SWAP_TO_HOST | PGLB_FEATURE_ATTENTION_SINKS | PGLB_FEATURE_DETERMINISTIC |
         PGLB_FEATURE_KV_EVICTION;
}

static pglb_status set_deterministic(pglb_device* d, int32_t on) {
  (void)d;
  (void)on;  /* one thread, fixed order: always */
  return PGLB_OK;
}

static int32_t supports_weight(pglb_device* d, pglb_dtype t) {
  (void)d;
  return is_float_weight(t);
}

static int32_t supports_op(pglb_device* d, const pglb_op_query* q) {
  (void)d;
  switch (q->op) {
    case PGLB_OP_MATMUL:
    case PGLB_OP_EMBED:
      return q->n_operands == 0 || is_float_weight(q->types[0]);
    case PGLB_OP_ADD_BIAS: case PGLB_OP_RMS_NORM: case PGLB_OP_ROPE: case PGLB_OP_STORE_KV:
    case PGLB_OP_ATTENTION: case PGLB_OP_GLU: case PGLB_OP_ADD: case PGLB_OP_GATHER_ROWS: case PGLB_OP_SOFTCAP:
      return 1;
    default:
      return 0;  /* Mixture-of-Experts, sample */
  }
}

static pglb_status weight_upload(pglb_device* d, const pglb_tensor* t, pglb_weight** out, pglb_weight_info* info) {
  pglb_weight* w;
  int64_t rows = 1, r;
  int i;
  const int vector = t->n_dims <= 1;
  if (!is_float_weight(t->type))
    return failf(d, PGLB_UNSUPPORTED, "tensor '%s': type %d is not F32, F16 or BF16", t->name, (int)t->type);
  if (t->n_dims < 1 || t->n_dims > 4 || !t->data)
    return failf(d, PGLB_INVALID_ARGUMENT, "tensor '%s': %d dimensions, data %p", t->name, (int)t->n_dims, t->data);
  for (i = 1; i < t->n_dims; ++i) rows *= t->shape[i];
  w = (pglb_weight*)calloc(1, sizeof *w);
  if (!w) return failf(d, PGLB_OUT_OF_MEMORY, "out of memory");
  w->rows = rows;
  w->cols = t->shape[0];
  w->type = vector ? PGLB_F32 : t->type;  /* vectors are held as F32 */
  w->bytes = (size_t)(rows * w->cols) * type_size(w->type);
  w->data = malloc(w->bytes ? w->bytes : 1);
  if (!w->data) {
    free(w);
    return failf(d, PGLB_OUT_OF_MEMORY, "out of memory for tensor '%s'", t->name);
  }
  if (vector) {  /* read it in its own type */
    pglb_weight src = *w;
    src.type = t->type;
    src.data = (void*)t->data;
    for (r = 0; r < rows; ++r) weight_row(&src, r, (float*)w->data + r * w->cols);
  } else {
    memcpy(w->data, t->data, w->bytes);
  }
  if (info && PGLB_HAS(info, held_type)) info->held_type = w->type;
  if (info && PGLB_HAS(info, held_bytes)) info->held_bytes = w->bytes;
  *out = w;
  return PGLB_OK;
}

static void weight_free(pglb_device* d, pglb_weight* w) {
  (void)d;
  if (!w) return;
  free(w->data);
  free(w);
}

static int32_t buffer_type_count(pglb_device* d) {
  (void)d;
  return 1;
}

static pglb_status buffer_type_info(pglb_device* d, int32_t type, pglb_buffer_type_info* out) {
  pglb_buffer_type_info i;
  if (type != 0) return failf(d, PGLB_INVALID_ARGUMENT, "buffer type %d: there is one (0)", (int)type);
  memset(&i, 0, sizeof i);
  i.name = KIND;
  i.is_host = 1;
  i.alignment = 16;
  i.struct_size = out->struct_size < sizeof i ? out->struct_size : sizeof i;
  memcpy(out, &i, i.struct_size);
  return PGLB_OK;
}

static pglb_status buffer_alloc(pglb_device* d, int32_t type, pglb_dtype dtype, size_t count, pglb_buffer** out) {
  pglb_buffer* b;
  const size_t size = type_size(dtype);
  if (type != 0) return failf(d, PGLB_INVALID_ARGUMENT, "buffer type %d: there is one (0)", (int)type);
  if (!size) return failf(d, PGLB_UNSUPPORTED, "buffers of type %d", (int)dtype);
  b = (pglb_buffer*)calloc(1, sizeof *b);
  if (!b) return failf(d, PGLB_OUT_OF_MEMORY, "out of memory");
  b->dtype = dtype;
  b->count = count;
  b->bytes = count * size;
  b->data = (unsigned char*)calloc(b->bytes ? b->bytes : 1, 1);
  if (!b->data) {
    free(b);
    return failf(d, PGLB_OUT_OF_MEMORY, "out of memory for a buffer of %zu bytes", count * size);
  }
  *out = b;
  return PGLB_OK;
}

static void buffer_free(pglb_device* d, pglb_buffer* b) {
  (void)d;
  if (!b) return;
  free(b->data);
  free(b);
}

/* ---- the KV cache */

static size_t kv_elem_size(const pglb_device* d) { return d->kv.dtype == PGLB_F16 ? 2 : 4; }
static size_t kv_block_elems(const pglb_device* d) {
  return (size_t)d->kv.n_kv_heads * (size_t)d->kv.block_size * (size_t)d->kv.head_dim;
}
/* K (kv = 0) or V (kv = 1) of a layer. */
static unsigned char* kv_base(pglb_device* d, unsigned char* pool, int32_t layer, int kv, int32_t num_blocks) {
  const size_t layer_bytes = (size_t)num_blocks * kv_block_elems(d) * kv_elem_size(d);
  return pool + ((size_t)layer * 2 + (size_t)kv) * layer_bytes;
}

static pglb_status kv_allocate(pglb_device* d, const pglb_kv_spec* spec) {
  size_t bytes;
  if (spec->dtype != PGLB_F32 && spec->dtype != PGLB_F16)
    return failf(d, PGLB_UNSUPPORTED, "KV cache type %d: only F32 and F16", (int)spec->dtype);
  if (spec->n_layers <= 0 || spec->n_kv_heads <= 0 || spec->head_dim <= 0 || spec->block_size <= 0 ||
      spec->num_blocks <= 0)
    return failf(d, PGLB_INVALID_ARGUMENT, "KV cache: every size must be positive");
  free(d->kv_data);
  free(d->swap_data);
  d->swap_data = NULL;
  d->swap_blocks = 0;
  d->kv = *spec;
  d->has_kv = 0;
  bytes = (size_t)spec->n_layers * 2 * (size_t)spec->num_blocks * kv_block_elems(d) * kv_elem_size(d);
  d->kv_data = (unsigned char*)calloc(bytes, 1);
  if (!d->kv_data) return failf(d, PGLB_OUT_OF_MEMORY, "out of memory for a KV cache of %zu bytes", bytes);
  d->has_kv = 1;
  return PGLB_OK;
}

static pglb_status swap_allocate(pglb_device* d, int32_t num_blocks) {
  size_t bytes;
  if (!d->has_kv) return failf(d, PGLB_INVALID_ARGUMENT, "swap space before the KV cache");
  if (num_blocks <= 0) return failf(d, PGLB_INVALID_ARGUMENT, "swap space of %d blocks", (int)num_blocks);
  free(d->swap_data);
  bytes = (size_t)d->kv.n_layers * 2 * (size_t)num_blocks * kv_block_elems(d) * kv_elem_size(d);
  d->swap_data = (unsigned char*)calloc(bytes, 1);
  if (!d->swap_data) return failf(d, PGLB_OUT_OF_MEMORY, "out of memory for a swap pool of %zu bytes", bytes);
  d->swap_blocks = num_blocks;
  return PGLB_OK;
}

/* Whole blocks, all layers, K and V, from one pool to another. */
static pglb_status move_blocks(pglb_device* d, unsigned char* from, int32_t from_n, unsigned char* to, int32_t to_n,
                               const pglb_block_pair* pairs, size_t n) {
  size_t i;
  int32_t layer;
  int kv;
  const size_t block_bytes = kv_block_elems(d) * kv_elem_size(d);
  if (!from || !to) return failf(d, PGLB_INVALID_ARGUMENT, "block copy without a KV cache or swap pool");
  for (i = 0; i < n; ++i)
    if (pairs[i].src < 0 || pairs[i].src >= from_n || pairs[i].dst < 0 || pairs[i].dst >= to_n)
      return failf(d, PGLB_INVALID_ARGUMENT, "block pair (%d, %d) out of range", (int)pairs[i].src, (int)pairs[i].dst);
  for (layer = 0; layer < d->kv.n_layers; ++layer)
    for (kv = 0; kv < 2; ++kv)
      for (i = 0; i < n; ++i)
        memmove(kv_base(d, to, layer, kv, to_n) + (size_t)pairs[i].dst * block_bytes,
                kv_base(d, from, layer, kv, from_n) + (size_t)pairs[i].src * block_bytes, block_bytes);
  return PGLB_OK;
}

static float kv_get(const pglb_device* d, const unsigned char* base, size_t i) {
  return d->kv.dtype == PGLB_F16 ? f16_to_f32(((const uint16_t*)base)[i]) : ((const float*)base)[i];
}
static void kv_put(const pglb_device* d, unsigned char* base, size_t i, float x) {
  if (d->kv.dtype == PGLB_F16) ((uint16_t*)base)[i] = f32_to_f16(x);
  else ((float*)base)[i] = x;
}
/* Element index of (slot, head, dim) in one layer's K or V. */
static size_t kv_index(const pglb_device* d, int64_t slot, int32_t h, int32_t e) {
  const int64_t block = slot / d->kv.block_size, off = slot % d->kv.block_size;
  return (((size_t)block * (size_t)d->kv.n_kv_heads + (size_t)h) * (size_t)d->kv.block_size + (size_t)off) *
             (size_t)d->kv.head_dim + (size_t)e;
}

/* ---- RoPE: pair i of a head turns by pos * inv_freq[i]; cos and sin are
 * scaled by the returned factor (the formula of backend.h, YaRN included). */

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

static double rope_frequencies(pglb_device* d, const pglb_rope_config* c, double* inv_freq) {
  const int half = c->n_rot / 2;
  const double base = c->freq_base, scale = c->freq_scale;
  const int yarn = c->ext_factor > 0 && c->n_ctx_orig > 0;
  const float* factors = c->freq_factors ? (const float*)c->freq_factors->data : NULL;
  double low = 0, high = 0;
  int i;
  (void)d;
  if (yarn) {
    /* the pair index where a frequency makes `turns` rotations over n_ctx_orig tokens */
    low = c->n_rot * log(c->n_ctx_orig / (c->beta_fast * 2 * PI)) / (2 * log(base));
    high = c->n_rot * log(c->n_ctx_orig / (c->beta_slow * 2 * PI)) / (2 * log(base));
    if (c->yarn_truncate) {
      low = floor(low);
      high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > c->n_rot - 1.0) high = c->n_rot - 1.0;
  }
  for (i = 0; i < half; ++i) {
    const double extrapolated = pow(base, -2.0 * i / c->n_rot);
    double f = extrapolated * scale;
    if (yarn) {
      const double span = high - low > 0.001 ? high - low : 0.001;
      const double mix = (1.0 - clampd((i - low) / span, 0.0, 1.0)) * c->ext_factor;
      f = f * (1 - mix) + extrapolated * mix;
    }
    if (factors) f /= factors[i];
    inv_freq[i] = f;
  }
  return yarn ? c->attn_factor * (1.0 + 0.1 * log(1.0 / scale)) : c->attn_factor;
}

/* Rotates x[n_tokens, n_heads * head_dim] in place at the batch positions. */
static pglb_status rope_rows(pglb_device* d, float* x, int32_t n_heads, int32_t head_dim, const pglb_rope_config* c) {
  const int half = c->n_rot / 2;
  double* inv_freq;
  double mscale;
  int64_t t;
  int32_t h;
  int i;
  if (c->n_rot <= 0 || c->n_rot > head_dim || c->n_rot % 2)
    return failf(d, PGLB_INVALID_ARGUMENT, "rope: n_rot %d with head_dim %d", (int)c->n_rot, (int)head_dim);
  if (c->freq_factors && c->freq_factors->cols * c->freq_factors->rows < half)
    return failf(d, PGLB_INVALID_ARGUMENT, "rope: fewer frequency factors than %d pairs", half);
  inv_freq = (double*)malloc((size_t)half * sizeof(double));
  if (!inv_freq) return failf(d, PGLB_OUT_OF_MEMORY, "out of memory");
  mscale = rope_frequencies(d, c, inv_freq);
  for (t = 0; t < d->batch.n_tokens; ++t)
    for (h = 0; h < n_heads; ++h) {
      float* v = x + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
      for (i = 0; i < half; ++i) {
        const double th = d->batch.positions[t] * inv_freq[i];
        const double cs = cos(th) * mscale, sn = sin(th) * mscale;
        const int a = c->neox ? i : 2 * i, b = c->neox ? i + half : 2 * i + 1;
        const double xa = v[a], xb = v[b];
        v[a] = (float)(xa * cs - xb * sn);
        v[b] = (float)(xa * sn + xb * cs);
      }
    }
  free(inv_freq);
  return PGLB_OK;
}

/* ---- ops */

static pglb_status op_embed(pglb_device* d, const pglb_embed_params* p) {
  int64_t t, c;
  const pglb_weight* w = p->table;
  if (!w) return failf(d, PGLB_INVALID_ARGUMENT, "embed: no table");
  if (!check_buffer(d, p->out, d->batch.n_tokens * w->cols, "embed out")) return PGLB_INVALID_ARGUMENT;
  for (t = 0; t < d->batch.n_tokens; ++t) {
    const int32_t id = d->batch.token_ids[t];
    float* out = f32(p->out) + t * w->cols;
    if (id < 0 || id >= w->rows)
      return failf(d, PGLB_INVALID_ARGUMENT, "embed: token id %d outside the table's %lld rows", (int)id,
                   (long long)w->rows);
    weight_row(w, id, out);
    for (c = 0; c < w->cols; ++c) out[c] *= p->scale;
  }
  return PGLB_OK;
}

static pglb_status op_matmul(pglb_device* d, const pglb_matmul_params* p) {
  const pglb_weight* w = p->w;
  float* row;
  int64_t r, i, c;
  if (!w) return failf(d, PGLB_INVALID_ARGUMENT, "matmul: no weight");
  if (!check_buffer(d, p->x, p->n * w->cols, "matmul x") || !check_buffer(d, p->y, p->n * w->rows, "matmul y"))
    return PGLB_INVALID_ARGUMENT;
  if (p->x == p->y) return failf(d, PGLB_INVALID_ARGUMENT, "matmul: y may not be x");
  row = (float*)malloc((size_t)w->cols * sizeof(float));
  if (!row) return failf(d, PGLB_OUT_OF_MEMORY, "out of memory");
  for (r = 0; r < w->rows; ++r) {
    weight_row(w, r, row);
    for (i = 0; i < p->n; ++i) {
      const float* x = f32(p->x) + i * w->cols;
      double s = 0;
      for (c = 0; c < w->cols; ++c) s += (double)x[c] * row[c];
      f32(p->y)[i * w->rows + r] = (float)s;
    }
  }
  free(row);
  return PGLB_OK;
}

static pglb_status op_add_bias(pglb_device* d, const pglb_add_bias_params* p) {
  int64_t r, c;
  const pglb_weight* b = p->bias;
  if (!b) return failf(d, PGLB_INVALID_ARGUMENT, "add_bias: no bias");
  if (!check_buffer(d, p->y, p->n * b->cols, "add_bias y")) return PGLB_INVALID_ARGUMENT;
  for (r = 0; r < p->n; ++r)
    for (c = 0; c < b->cols; ++c) f32(p->y)[r * b->cols + c] += ((const float*)b->data)[c];
  return PGLB_OK;
}

static pglb_status op_rms_norm(pglb_device* d, const pglb_rms_norm_params* p) {
  int64_t r, c;
  if (!check_buffer(d, p->x, p->n_rows * p->dim, "rms_norm x") ||
      !check_buffer(d, p->y, p->n_rows * p->dim, "rms_norm y"))
    return PGLB_INVALID_ARGUMENT;
  if (p->w && p->w->cols * p->w->rows < p->dim)
    return failf(d, PGLB_INVALID_ARGUMENT, "rms_norm: a weight shorter than %lld", (long long)p->dim);
  for (r = 0; r < p->n_rows; ++r) {
    const float* x = f32(p->x) + r * p->dim;
    float* y = f32(p->y) + r * p->dim;
    double ss = 0, inv;
    for (c = 0; c < p->dim; ++c) ss += (double)x[c] * x[c];
    inv = 1.0 / sqrt(ss / (double)p->dim + p->eps);
    for (c = 0; c < p->dim; ++c) y[c] = (float)(x[c] * inv * (p->w ? ((const float*)p->w->data)[c] : 1.0f));
  }
  return PGLB_OK;
}

static pglb_status op_rope(pglb_device* d, const pglb_rope_params* p) {
  if (!p->rope) return failf(d, PGLB_INVALID_ARGUMENT, "rope: no config");
  if (!check_buffer(d, p->x, d->batch.n_tokens * p->n_heads * p->head_dim, "rope x")) return PGLB_INVALID_ARGUMENT;
  return rope_rows(d, f32(p->x), p->n_heads, p->head_dim, p->rope);
}

static pglb_status op_store_kv(pglb_device* d, const pglb_store_kv_params* p) {
  const int32_t H = d->kv.n_kv_heads, D = d->kv.head_dim;
  const int64_t n = d->batch.n_tokens, slots = (int64_t)d->kv.num_blocks * d->kv.block_size;
  unsigned char *kb, *vb;
  int64_t t;
  int32_t h, e;
  if (!d->has_kv) return failf(d, PGLB_INVALID_ARGUMENT, "store_kv before the KV cache");
  if (p->layer < 0 || p->layer >= d->kv.n_layers) return failf(d, PGLB_INVALID_ARGUMENT, "store_kv: layer %d", (int)p->layer);
  if (!check_buffer(d, p->k, n * H * D, "store_kv k") || !check_buffer(d, p->v, n * H * D, "store_kv v"))
    return PGLB_INVALID_ARGUMENT;
  if (p->k_rope) {
    const pglb_status st = rope_rows(d, f32(p->k), H, D, p->k_rope);
    if (st != PGLB_OK) return st;
  }
  kb = kv_base(d, d->kv_data, p->layer, 0, d->kv.num_blocks);
  vb = kv_base(d, d->kv_data, p->layer, 1, d->kv.num_blocks);
  for (t = 0; t < n; ++t) {
    const int64_t slot = d->batch.slot_mapping[t];
    if (slot < 0) continue;  /* a padding token */
    if (slot >= slots) return failf(d, PGLB_INVALID_ARGUMENT, "store_kv: slot %lld outside the cache", (long long)slot);
    for (h = 0; h < H; ++h)
      for (e = 0; e < D; ++e) {
        const size_t src = ((size_t)t * (size_t)H + (size_t)h) * (size_t)D + (size_t)e;
        kv_put(d, kb, kv_index(d, slot, h, e), f32(p->k)[src]);
        kv_put(d, vb, kv_index(d, slot, h, e), f32(p->v)[src]);
      }
  }
  return PGLB_OK;
}

/* Causal attention of every query row over its sequence's cache, in double:
 * scores, then one softmax (with the head's sink logit when there is one). */
static pglb_status op_attention(pglb_device* d, const pglb_attention_params* p) {
  const int32_t D = p->head_dim, bs = d->kv.block_size;
  const unsigned char *kb, *vb;
  double *scores, *acc;
  int32_t s, i, h, e;
  int64_t j;
  if (!d->has_kv) return failf(d, PGLB_INVALID_ARGUMENT, "attention before the KV cache");
  if (p->layer < 0 || p->layer >= d->kv.n_layers) return failf(d, PGLB_INVALID_ARGUMENT, "attention: layer %d", (int)p->layer);
  if (p->n_head_kv != d->kv.n_kv_heads || D != d->kv.head_dim || p->n_head <= 0 || p->n_head % p->n_head_kv)
    return failf(d, PGLB_INVALID_ARGUMENT, "attention: %d/%d heads of %d against a cache of %d KV heads of %d",
                 (int)p->n_head, (int)p->n_head_kv, (int)D, (int)d->kv.n_kv_heads, (int)d->kv.head_dim);
  if (p->sinks && p->sinks->cols * p->sinks->rows < p->n_head)
    return failf(d, PGLB_INVALID_ARGUMENT, "attention: fewer sinks than heads");
  if (!check_buffer(d, p->q, d->batch.n_tokens * p->n_head * D, "attention q") ||
      !check_buffer(d, p->out, d->batch.n_tokens * p->n_head * D, "attention out"))
    return PGLB_INVALID_ARGUMENT;
  kb = kv_base(d, d->kv_data, p->layer, 0, d->kv.num_blocks);
  vb = kv_base(d, d->kv_data, p->layer, 1, d->kv.num_blocks);
  acc = (double*)malloc((size_t)D * sizeof(double));
  scores = NULL;
  if (!acc) return failf(d, PGLB_OUT_OF_MEMORY, "out of memory");
  for (s = 0; s < d->batch.n_seqs; ++s) {
    const pglb_seq* q = &d->batch.seqs[s];
    if ((int64_t)q->n_blocks * bs < q->ctx_len || q->q_len > q->ctx_len || q->q_start < 0 ||
        q->q_start + q->q_len > d->batch.n_tokens) {
      free(acc);
      free(scores);
      return failf(d, PGLB_INVALID_ARGUMENT, "attention: sequence %d does not fit its block table or the batch", (int)s);
    }
    free(scores);
    scores = (double*)malloc((size_t)(q->ctx_len > 0 ? q->ctx_len : 1) * sizeof(double));
    if (!scores) {
      free(acc);
      return failf(d, PGLB_OUT_OF_MEMORY, "out of memory");
    }
    for (i = 0; i < q->q_len; ++i) {
      const int64_t row = q->q_start + i, pos = q->ctx_len - q->q_len + i;
      for (h = 0; h < p->n_head; ++h) {
        const int32_t g = h / (p->n_head / p->n_head_kv);
        const float* qv = f32(p->q) + ((size_t)row * (size_t)p->n_head + (size_t)h) * (size_t)D;
        float* out = f32(p->out) + ((size_t)row * (size_t)p->n_head + (size_t)h) * (size_t)D;
        double mx = p->sinks ? ((const float*)p->sinks->data)[h] : -INFINITY, l;
        for (j = 0; j <= pos; ++j) {
          const int64_t slot = (int64_t)q->block_table[j / bs] * bs + j % bs;
          double dot = 0;
          scores[j] = -INFINITY;
          if (p->sliding_window > 0 && j <= pos - p->sliding_window) continue;
          if (j >= q->kv_sinks && j < q->kv_evicted_to) continue;
          for (e = 0; e < D; ++e) dot += (double)qv[e] * kv_get(d, kb, kv_index(d, slot, g, e));
          dot *= p->scale;
          if (p->softcap > 0) dot = p->softcap * tanh(dot / p->softcap);
          scores[j] = dot;
          if (dot > mx) mx = dot;
        }
        l = p->sinks ? exp(((const float*)p->sinks->data)[h] - mx) : 0.0;
        for (e = 0; e < D; ++e) acc[e] = 0;
        for (j = 0; j <= pos; ++j) {
          const int64_t slot = (int64_t)q->block_table[j / bs] * bs + j % bs;
          double w;
          if (scores[j] == -INFINITY) continue;  /* masked: its value is never read */
          w = exp(scores[j] - mx);
          l += w;
          for (e = 0; e < D; ++e) acc[e] += w * kv_get(d, vb, kv_index(d, slot, g, e));
        }
        for (e = 0; e < D; ++e) out[e] = (float)(l > 0 ? acc[e] / l : 0.0);
      }
    }
  }
  free(acc);
  free(scores);
  return PGLB_OK;
}

static pglb_status op_glu(pglb_device* d, const pglb_glu_params* p) {
  int64_t i;
  if (!check_buffer(d, p->gate, p->n, "glu gate") || !check_buffer(d, p->up, p->n, "glu up") ||
      !check_buffer(d, p->out, p->n, "glu out"))
    return PGLB_INVALID_ARGUMENT;
  if (p->act < PGLB_ACT_SILU || p->act > PGLB_ACT_SIGMOID)
    return failf(d, PGLB_INVALID_ARGUMENT, "glu: activation %d", (int)p->act);
  for (i = 0; i < p->n; ++i) {
    const double g = f32(p->gate)[i], u = f32(p->up)[i];
    double r;
    if (p->act == PGLB_ACT_SILU) {
      r = g / (1 + exp(-g)) * u;
    } else if (p->act == PGLB_ACT_GELU_TANH) {
      r = 0.5 * g * (1 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    } else if (p->act == PGLB_ACT_SIGMOID) {
      r = u / (1 + exp(-g));
    } else {  /* gpt-oss: gate clamped above at 7, up to [-7, 7] */
      const double c = g < 7.0 ? g : 7.0;
      r = c / (1 + exp(-1.702 * c)) * (clampd(u, -7.0, 7.0) + 1);
    }
    f32(p->out)[i] = (float)r;
  }
  return PGLB_OK;
}

static pglb_status op_add(pglb_device* d, const pglb_add_params* p) {
  int64_t i;
  if (!check_buffer(d, p->y, p->n, "add y") || !check_buffer(d, p->x, p->n, "add x")) return PGLB_INVALID_ARGUMENT;
  for (i = 0; i < p->n; ++i) f32(p->y)[i] += f32(p->x)[i];
  return PGLB_OK;
}

static pglb_status op_gather_rows(pglb_device* d, const pglb_gather_rows_params* p) {
  int64_t i;
  if (!check_buffer(d, p->out, p->n_rows * p->dim, "gather_rows out") || !p->x || (p->n_rows && !p->rows))
    return p->x ? PGLB_INVALID_ARGUMENT : failf(d, PGLB_INVALID_ARGUMENT, "gather_rows: no input");
  for (i = 0; i < p->n_rows; ++i) {
    if (p->rows[i] < 0 || (uint64_t)((p->rows[i] + 1) * p->dim) > p->x->count)
      return failf(d, PGLB_INVALID_ARGUMENT, "gather_rows: row %d outside the input", (int)p->rows[i]);
    memmove(f32(p->out) + i * p->dim, f32(p->x) + p->rows[i] * p->dim, (size_t)p->dim * sizeof(float));
  }
  return PGLB_OK;
}

static pglb_status op_softcap(pglb_device* d, const pglb_softcap_params* p) {
  int64_t i;
  if (!check_buffer(d, p->x, p->n, "softcap x")) return PGLB_INVALID_ARGUMENT;
  if (!(p->cap > 0)) return failf(d, PGLB_INVALID_ARGUMENT, "softcap: cap %g", (double)p->cap);
  for (i = 0; i < p->n; ++i) f32(p->x)[i] = (float)(p->cap * tanh((double)f32(p->x)[i] / p->cap));
  return PGLB_OK;
}

/* ---- the stream: every op runs as it is enqueued */

static pglb_status copy_from_host(pglb_stream* s, const void* src, pglb_buffer* dst, size_t offset, size_t bytes) {
  if (!dst || offset > dst->bytes || bytes > dst->bytes - offset)
    return failf(s->dev, PGLB_INVALID_ARGUMENT, "copy_from_host: %zu bytes at %zu past a buffer of %zu", bytes,
                 offset, dst ? dst->bytes : 0);
  if (bytes) memcpy(dst->data + offset, src, bytes);
  return PGLB_OK;
}

static pglb_status copy_to_host(pglb_stream* s, const pglb_buffer* src, size_t offset, size_t bytes, void* dst) {
  if (!src || offset > src->bytes || bytes > src->bytes - offset)
    return failf(s->dev, PGLB_INVALID_ARGUMENT, "copy_to_host: %zu bytes at %zu past a buffer of %zu", bytes, offset,
                 src ? src->bytes : 0);
  if (bytes) memcpy(dst, src->data + offset, bytes);
  return PGLB_OK;
}

static pglb_status synchronize(pglb_stream* s) {
  (void)s;
  return PGLB_OK;
}

static pglb_status set_batch(pglb_stream* s, const pglb_batch* batch) {
  pglb_device* d = s->dev;
  int32_t i;
  if (batch->n_tokens < 0 || batch->n_seqs < 0 || (batch->n_seqs && !batch->seqs))
    return failf(d, PGLB_INVALID_ARGUMENT, "set_batch: bad counts");
  for (i = 0; i < batch->n_seqs; ++i)
    if (batch->seqs[i].n_blocks < 0 || (batch->seqs[i].n_blocks && !batch->seqs[i].block_table))
      return failf(d, PGLB_INVALID_ARGUMENT, "set_batch: sequence %d has no block table", (int)i);
  d->batch = *batch;
  return PGLB_OK;
}

static pglb_status enqueue(pglb_stream* s, pglb_op op, const void* params) {
  pglb_device* d = s->dev;
  if (!params) return failf(d, PGLB_INVALID_ARGUMENT, "op %d: no parameters", (int)op);
  switch (op) {
    case PGLB_OP_EMBED: return op_embed(d, (const pglb_embed_params*)params);
    case PGLB_OP_MATMUL: return op_matmul(d, (const pglb_matmul_params*)params);
    case PGLB_OP_ADD_BIAS: return op_add_bias(d, (const pglb_add_bias_params*)params);
    case PGLB_OP_RMS_NORM: return op_rms_norm(d, (const pglb_rms_norm_params*)params);
    case PGLB_OP_ROPE: return op_rope(d, (const pglb_rope_params*)params);
    case PGLB_OP_STORE_KV: return op_store_kv(d, (const pglb_store_kv_params*)params);
    case PGLB_OP_ATTENTION: return op_attention(d, (const pglb_attention_params*)params);
    case PGLB_OP_GLU: return op_glu(d, (const pglb_glu_params*)params);
    case PGLB_OP_ADD: return op_add(d, (const pglb_add_params*)params);
    case PGLB_OP_GATHER_ROWS: return op_gather_rows(d, (const pglb_gather_rows_params*)params);
    case PGLB_OP_SOFTCAP: return op_softcap(d, (const pglb_softcap_params*)params);
    default: return failf(d, PGLB_UNSUPPORTED, "the " KIND " backend has no op %d", (int)op);
  }
}

static pglb_status copy_blocks(pglb_stream* s, const pglb_block_pair* pairs, size_t n) {
  pglb_device* d = s->dev;
  return move_blocks(d, d->kv_data, d->kv.num_blocks, d->kv_data, d->kv.num_blocks, pairs, n);
}
static pglb_status swap_out(pglb_stream* s, const pglb_block_pair* pairs, size_t n) {
  pglb_device* d = s->dev;
  return move_blocks(d, d->kv_data, d->kv.num_blocks, d->swap_data, d->swap_blocks, pairs, n);
}
static pglb_status swap_in(pglb_stream* s, const pglb_block_pair* pairs, size_t n) {
  pglb_device* d = s->dev;
  return move_blocks(d, d->swap_data, d->swap_blocks, d->kv_data, d->kv.num_blocks, pairs, n);
}

static pglb_status stream_create(pglb_device* d, pglb_stream** out) {
  pglb_stream* s = (pglb_stream*)calloc(1, sizeof *s);
  if (!s) return failf(d, PGLB_OUT_OF_MEMORY, "out of memory");
  s->dev = d;
  *out = s;
  return PGLB_OK;
}
static void stream_destroy(pglb_device* d, pglb_stream* s) {
  (void)d;
  free(s);
}
static pglb_status event_create(pglb_device* d, pglb_event** out) {
  pglb_event* e = (pglb_event*)calloc(1, sizeof *e);
  if (!e) return failf(d, PGLB_OUT_OF_MEMORY, "out of memory");
  *out = e;
  return PGLB_OK;
}
static pglb_status event_synchronize(pglb_device* d, pglb_event* e) {
  (void)d;
  (void)e;
  return PGLB_OK;
}
static void event_destroy(pglb_device* d, pglb_event* e) {
  (void)d;
  free(e);
}
static pglb_status event_record(pglb_stream* s, pglb_event* e) {
  (void)s;
  (void)e;
  return PGLB_OK;
}
static pglb_status event_wait(pglb_stream* s, pglb_event* e) {
  (void)s;
  (void)e;
  return PGLB_OK;
}

/* ---- the tables. Designated initializers: a member this plugin does not
 * provide stays null (here: profiling). */

static const pglb_device_iface device_table = {
    .struct_size = sizeof(pglb_device_iface),
    .close = device_close,
    .describe = describe,
    .last_error = last_error,
    .memory_info = memory_info,
    .features = features,
    .set_deterministic = set_deterministic,
    .supports_op = supports_op,
    .supports_weight = supports_weight,
    .weight_upload = weight_upload,
    .weight_free = weight_free,
    .buffer_type_count = buffer_type_count,
    .buffer_type_info = buffer_type_info,
    .buffer_alloc = buffer_alloc,
    .buffer_free = buffer_free,
    .kv_allocate = kv_allocate,
    .swap_allocate = swap_allocate,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .event_create = event_create,
    .event_synchronize = event_synchronize,
    .event_destroy = event_destroy,
};

static const pglb_stream_iface stream_table = {
    .struct_size = sizeof(pglb_stream_iface),
    .copy_from_host = copy_from_host,
    .copy_to_host = copy_to_host,
    .synchronize = synchronize,
    .set_batch = set_batch,
    .enqueue = enqueue,
    .copy_blocks = copy_blocks,
    .swap_out = swap_out,
    .swap_in = swap_in,
    .event_record = event_record,
    .event_wait = event_wait,
};

static const pglb_registry registry = {
#ifdef PGLB_TEST_SMALL_STRUCT
    .struct_size = 8,
#else
    .struct_size = sizeof(pglb_registry),
#endif
#ifdef PGLB_TEST_BAD_ABI
    .abi_version = PGLB_ABI_VERSION + 1000,
#else
    .abi_version = PGLB_ABI_VERSION,
#endif
    .kind = KIND,
    .description = "plain C11 scalar test backend (tests/plugins/c_scalar)",
    .device_count = device_count,
    .device_open = device_open,
    .device = &device_table,
    .stream = &stream_table,
    .comm = NULL,  /* collectives go through the host */
};

__attribute__((visibility("default"))) const pglb_registry* pglb_registry_v2(void) { return &registry; }
