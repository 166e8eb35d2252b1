/* pagellm backend plugin ABI, version 2: plain C.
 *
 * A backend plugin is a shared library, written in any language with a C
 * ABI, built by any compiler. It exports one function, PGLB_ENTRY_POINT,
 * which returns its registry: the device kind it serves and the function
 * tables of its objects, one level below the other as in ggml's backend
 * interface:
 *
 *   registry -> devices -> buffer types -> buffers (and weights)
 *                       -> streams (ops, copies, events) -> communicators
 *
 * Rules every table follows:
 * - Handles are opaque: the core holds them and hands them back, never
 *   looks inside. A plugin may cast them to its own structs.
 * - Every table and every parameter struct starts with `struct_size`, set by
 *   whoever fills it to sizeof of the struct it was built with. Members are
 *   only ever appended; a reader uses a member only when struct_size shows
 *   it is there (PGLB_HAS). A null function pointer is "not provided".
 * - Functions return pglb_status. On failure the plugin keeps a message for
 *   the device's last_error (or writes it into the caller's buffer where one
 *   is passed); no C++ exception and no longjmp crosses this boundary.
 * - Ops are enqueued in order on a stream and may return before their work is
 *   done. stream_synchronize waits for everything enqueued.
 * - A plugin needs no symbol of pagellm's: it may be loaded by the pagellm
 *   executable, by libpagellm.so (the C API) and by the Python module alike.
 *
 * A plugin built against ABI v1 (a C++ pagellm::Backend behind
 * `pagellm_backend_plugin`) is refused with a message saying so.
 * docs/backends.md is the guide: what a vendor implements, op by op.
 */
#ifndef PAGELLM_BACKEND_H
#define PAGELLM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PGLB_ABI_VERSION 2u
#define PGLB_ENTRY_POINT "pglb_registry_v2"
/* The symbol of ABI v1 plugins, looked for only to refuse them clearly. */
#define PGLB_V1_ENTRY_POINT "pagellm_backend_plugin"

/* Whether struct *s (which starts with struct_size) holds member m. */
#define PGLB_HAS(s, m) ((s)->struct_size >= offsetof(__typeof__(*(s)), m) + sizeof((s)->m))

typedef enum pglb_status {
  PGLB_OK = 0,
  PGLB_ERROR = 1,            /* see last_error */
  PGLB_UNSUPPORTED = 2,      /* this op / type / shape is not implemented */
  PGLB_OUT_OF_MEMORY = 3,
  PGLB_INVALID_ARGUMENT = 4,
} pglb_status;

/* Element types. The values are GGUF's (ggml_type): a weight's type maps
 * from the file without a table. */
typedef enum pglb_dtype {
  PGLB_F32 = 0, PGLB_F16 = 1, PGLB_Q4_0 = 2, PGLB_Q4_1 = 3, PGLB_Q5_0 = 6, PGLB_Q5_1 = 7,
  PGLB_Q8_0 = 8, PGLB_Q8_1 = 9, PGLB_Q2_K = 10, PGLB_Q3_K = 11, PGLB_Q4_K = 12, PGLB_Q5_K = 13,
  PGLB_Q6_K = 14, PGLB_Q8_K = 15, PGLB_IQ4_NL = 20, PGLB_IQ4_XS = 23, PGLB_I8 = 24, PGLB_I16 = 25,
  PGLB_I32 = 26, PGLB_I64 = 27, PGLB_F64 = 28, PGLB_BF16 = 30, PGLB_MXFP4 = 39,
} pglb_dtype;

/* Opaque handles, defined by the plugin. */
typedef struct pglb_device pglb_device;
typedef struct pglb_buffer pglb_buffer;   /* activation memory */
typedef struct pglb_weight pglb_weight;   /* an uploaded weight tensor */
typedef struct pglb_stream pglb_stream;   /* an in-order queue of work */
typedef struct pglb_event pglb_event;     /* a point in a stream */
typedef struct pglb_comm pglb_comm;       /* one rank's end of a device communicator */

/* Optional abilities (pglb_device_iface.features). */
enum {
  PGLB_FEATURE_SWAP_TO_HOST = 1u << 0,      /* swap_allocate / swap_out / swap_in */
  PGLB_FEATURE_ASYNC_OPS = 1u << 1,         /* ops return before their work is done */
  PGLB_FEATURE_MIXTURE_OF_EXPERTS = 1u << 2,
  PGLB_FEATURE_ATTENTION_SINKS = 1u << 3,   /* pglb_attention_params.sinks */
  PGLB_FEATURE_DETERMINISTIC = 1u << 4,     /* set_deterministic(1) */
  PGLB_FEATURE_KV_EVICTION = 1u << 5,       /* pglb_seq.kv_sinks / kv_evicted_to */
  PGLB_FEATURE_KV_GROUPS = 1u << 6,         /* pglb_kv_spec.layer_group / layer_slot, group tables and slots */
  /* Gated DeltaNet layers: pglb_kv_spec's state fields, pglb_seq.state_slot,
   * the causal_conv1d and gated_delta_rule ops, stream copy_states. */
  PGLB_FEATURE_LINEAR_ATTENTION = 1u << 7,
  PGLB_FEATURE_KV_V_IS_K = 1u << 8,         /* pglb_kv_spec.v_is_k */
  PGLB_FEATURE_KV_LAYER_SHAPES = 1u << 9,   /* pglb_kv_spec.layer_kv_heads / layer_head_dim */
  PGLB_FEATURE_NON_CAUSAL_ATTENTION = 1u << 10,  /* pglb_attention_params.non_causal (encoders: BERT) */
  /* pglb_attention_params.non_causal with a sliding_window: keys at |p - j| < sliding_window (EmbeddingGemma) */
  PGLB_FEATURE_SYMMETRIC_WINDOW_ATTENTION = 1u << 11,
  PGLB_FEATURE_KV_BLOCK_IO = 1u << 12,      /* stream read_kv_blocks / write_kv_blocks (the KV offload tier) */
};

/* Backend-specific settings ("threads" = "2"), parallel arrays of strings.
 * A device refuses keys it does not know. */
typedef struct pglb_options {
  size_t struct_size;
  size_t count;
  const char* const* keys;
  const char* const* values;
} pglb_options;

typedef struct pglb_memory_info {
  size_t struct_size;
  size_t total_bytes;
  size_t free_bytes;      /* now, before the KV cache is allocated */
  int32_t host_memory;    /* 1: the device computes in the host's RAM (CPU, PoCL) */
} pglb_memory_info;

/* ---- buffer types: kinds of memory a device offers. Index 0 is the
 * device's own memory, which every op reads and writes. */
typedef struct pglb_buffer_type_info {
  size_t struct_size;
  const char* name;       /* "cpu", "opencl0", "opencl0_host" */
  int32_t is_host;        /* the host can read it in place */
  size_t alignment;       /* of every buffer's start */
  size_t max_size;        /* bytes of the largest buffer; 0: no limit */
} pglb_buffer_type_info;

/* ---- tensors handed to the device */

/* A host tensor to upload (usually a view into the memory-mapped file).
 * shape[0] is the row length; rows = product of the others. */
typedef struct pglb_tensor {
  size_t struct_size;
  const char* name;
  pglb_dtype type;
  int32_t n_dims;
  int64_t shape[4];
  const void* data;
} pglb_tensor;

/* What an upload made of it: the type kept (a device may convert a type it
 * cannot multiply) and the device bytes it takes. */
typedef struct pglb_weight_info {
  size_t struct_size;
  pglb_dtype held_type;
  size_t held_bytes;
} pglb_weight_info;

/* ---- the paged KV cache: per layer, K and V, [num_blocks][n_kv_heads][block_size][head_dim] */
typedef struct pglb_kv_spec {
  size_t struct_size;
  int32_t n_layers, n_kv_heads, head_dim, block_size;
  int32_t num_blocks;     /* including block 0 (reserved padding block) */
  pglb_dtype dtype;       /* F32, F16, or I8 (one float scale per token and KV head) */
  /* PGLB_FEATURE_KV_GROUPS (0 / null: slot = layer, one group). Layers of one
   * KV-cache group share a block table; n_layers is then the slots of a
   * block, and layer l keeps its K/V in slot layer_slot[l] of the blocks of
   * group layer_group[l] (l < n_model_layers). */
  int32_t n_model_layers;
  const int32_t* layer_group;
  const int32_t* layer_slot;
  /* PGLB_FEATURE_LINEAR_ATTENTION (null: none). Layer l (< n_model_layers)
   * keeps a fixed-size state instead of K/V when layer_state[l] >= 0, its
   * index among the n_state_layers; each of state_slots slots holds, per
   * state layer, a conv state [conv_kernel - 1][conv_dim] then a recurrent
   * state [n_v_heads][head_k_dim][head_v_dim], F32. */
  const int32_t* layer_state;
  int32_t n_state_layers, state_slots, conv_dim, conv_kernel, n_v_heads, head_k_dim, head_v_dim;
  /* PGLB_FEATURE_KV_V_IS_K: 1: no V is stored; attention's values are the
   * keys (an MLA latent); store_kv's v is ignored. */
  int32_t v_is_k;
  /* PGLB_FEATURE_KV_LAYER_SHAPES (null: every layer n_kv_heads x head_dim):
   * layer l (< n_model_layers, given with layer_group / layer_slot) has
   * layer_kv_heads[l] heads of layer_head_dim[l]. A slot holds per token its
   * largest layer's heads x head_dim elements; a smaller layer fills the
   * start of each block as if it had (slot elements / its head_dim) heads,
   * and so do int8 scales. */
  const int32_t* layer_kv_heads;
  const int32_t* layer_head_dim;
} pglb_kv_spec;

/* ---- a step's batch (stream_set_batch) */
typedef struct pglb_seq {
  size_t struct_size;
  int32_t q_start, q_len, ctx_len;  /* rows [q_start, q_start + q_len) at positions [ctx_len - q_len, ctx_len) */
  const int32_t* block_table;       /* physical block of each logical block */
  int32_t n_blocks;
  int32_t kv_sinks, kv_evicted_to;  /* PGLB_FEATURE_KV_EVICTION: keys [kv_sinks, kv_evicted_to) are gone */
  /* PGLB_FEATURE_KV_GROUPS: groups 1..n_groups-1's tables, n_blocks each;
   * block 0 where a sliding window no longer sees a block. */
  const int32_t* const* group_tables;
  /* PGLB_FEATURE_LINEAR_ATTENTION: the sequence's state slot; it starts from
   * zeros when its first position this step is 0. */
  int32_t state_slot;
} pglb_seq;

typedef struct pglb_batch {
  size_t struct_size;
  int64_t n_tokens;
  const int32_t* token_ids;     /* [n_tokens] */
  const int32_t* positions;     /* [n_tokens] */
  const int64_t* slot_mapping;  /* [n_tokens] block * block_size + offset */
  int32_t n_seqs;
  const pglb_seq* seqs;
  /* PGLB_FEATURE_KV_GROUPS: KV-cache groups of the step (0 or 1: one), and
   * groups 1..n_groups-1's slot mappings, n_tokens each. */
  int32_t n_groups;
  const int64_t* const* group_slot_mappings;
} pglb_batch;

/* (source, destination) block pairs. */
typedef struct pglb_block_pair {
  int32_t src, dst;
} pglb_block_pair;

/* ---- ops. Each is enqueued with its own parameter struct; `n` is a row
 * count, matrices are row-major [n, cols]; activations are F32 buffers at
 * least as large as the rows an op reads or writes. */
typedef enum pglb_op {
  PGLB_OP_EMBED = 0,          /* out[n_tokens, table.cols] = scale * table[token_ids] */
  PGLB_OP_MATMUL = 1,         /* y[n, w.rows] = x[n, w.cols] W^T */
  PGLB_OP_ADD_BIAS = 2,       /* y[r] += bias */
  PGLB_OP_RMS_NORM = 3,       /* y[r] = x[r] / rms(x[r]) * w (w may be null); y may be x */
  PGLB_OP_ROPE = 4,           /* in place at the batch positions */
  PGLB_OP_STORE_KV = 5,       /* k, v into the cache at the batch slots (k rotated on the way if rope) */
  PGLB_OP_ATTENTION = 6,      /* causal paged attention over each sequence's cache */
  PGLB_OP_GLU = 7,            /* out = act(gate) * up; out may be gate */
  PGLB_OP_ADD = 8,            /* y += x */
  PGLB_OP_GATHER_ROWS = 9,    /* out[i] = x[rows[i]] */
  PGLB_OP_MOE_ROUTE = 10,     /* ids[n, k] (I32), weights[n, k] from router logits */
  PGLB_OP_MATMUL_EXPERTS = 11,
  PGLB_OP_MOE_COMBINE = 12,
  PGLB_OP_SCALE_ROWS_SIGMOID = 13,
  PGLB_OP_SOFTCAP = 14,       /* x = cap * tanh(x / cap) */
  PGLB_OP_SAMPLE = 15,        /* token ids from logits rows: greedy, top-k, top-p, min-p */
  /* Linear attention (Gated DeltaNet), with PGLB_FEATURE_LINEAR_ATTENTION */
  PGLB_OP_CAUSAL_CONV1D = 16,     /* depthwise causal conv + SiLU, continuing each sequence's conv state */
  PGLB_OP_GATED_DELTA_RULE = 17,  /* the gated delta rule recurrence over each sequence's tokens */
  /* Encoders (BERT); optional (supports_op) */
  PGLB_OP_LAYER_NORM = 18,        /* y[r] = (x[r] - mean) / sqrt(var + eps) * w + b; y may be x */
  PGLB_OP_ACTIVATION = 19,        /* out = act(x); out may be x */
  /* LoRA adapters; optional (supports_op): without it the host runs two MATMUL_EXPERTS and an ADD */
  PGLB_OP_LORA_MATMUL = 20,       /* y[t] += B[s] (A[s] x[t]) for each row t of slot s = slots[t] > 0 */
  /* Attention over this step's keys and values, not the cache (MLA's expanded form); optional (supports_op) */
  PGLB_OP_ATTENTION_KV = 21,
  /* The cached keys of some sequences as dense rows (MLA's expanded form after cached keys); optional */
  PGLB_OP_GATHER_KV = 22,
  PGLB_OP_COUNT
} pglb_op;

typedef enum pglb_activation {
  PGLB_ACT_SILU = 0,
  PGLB_ACT_GELU_TANH = 1,
  PGLB_ACT_SWIGLU_OAI = 2,
  PGLB_ACT_SIGMOID = 3, /* out = sigmoid(gate) * up */
  PGLB_ACT_GELU_ERF = 4 /* x / 2 (1 + erf(x / sqrt 2)); PGLB_OP_ACTIVATION only */
} pglb_activation;

typedef struct pglb_embed_params {
  size_t struct_size;
  const pglb_weight* table;
  float scale;
  pglb_buffer* out;
} pglb_embed_params;

typedef struct pglb_matmul_params {
  size_t struct_size;
  const pglb_weight* w;
  const pglb_buffer* x;
  int64_t n;
  pglb_buffer* y;
} pglb_matmul_params;

typedef struct pglb_add_bias_params {
  size_t struct_size;
  pglb_buffer* y;
  const pglb_weight* bias;
  int64_t n;
} pglb_add_bias_params;

typedef struct pglb_rms_norm_params {
  size_t struct_size;
  const pglb_buffer* x;
  const pglb_weight* w;  /* may be null */
  int64_t n_rows, dim;
  float eps;
  pglb_buffer* y;
} pglb_rms_norm_params;

/* RoPE of the leading n_rot dims of each head. YaRN when ext_factor > 0:
 * pairs that turn fewer than beta_slow times over n_ctx_orig tokens are
 * interpolated by freq_scale, pairs that turn more than beta_fast times keep
 * their frequency, linear between; cos and sin are scaled by attn_factor *
 * (1 + 0.1 ln(1 / freq_scale)). */
typedef struct pglb_rope_config {
  size_t struct_size;
  int32_t n_rot;
  float freq_base, freq_scale;
  int32_t neox;                      /* rotate (i, i + n_rot/2) pairs; else (2i, 2i+1) */
  const pglb_weight* freq_factors;   /* [n_rot / 2] divisors, may be null */
  float ext_factor, attn_factor, beta_fast, beta_slow;
  int32_t n_ctx_orig;
  int32_t yarn_truncate;             /* round the ramp's ends out to whole pairs */
} pglb_rope_config;

typedef struct pglb_rope_params {
  size_t struct_size;
  pglb_buffer* x;                    /* [n_tokens, n_heads * head_dim] */
  int32_t n_heads, head_dim;
  const pglb_rope_config* rope;
} pglb_rope_params;

typedef struct pglb_store_kv_params {
  size_t struct_size;
  int32_t layer;
  pglb_buffer* k;                    /* [n_tokens, n_kv_heads * head_dim]; rotated in place if k_rope */
  const pglb_buffer* v;
  const pglb_rope_config* k_rope;    /* may be null */
} pglb_store_kv_params;

typedef struct pglb_attention_params {
  size_t struct_size;
  int32_t layer;
  const pglb_buffer* q;              /* [n_tokens, n_head * head_dim] */
  pglb_buffer* out;                  /* [n_tokens, n_head * head_dim] */
  int32_t n_head, n_head_kv, head_dim;
  float scale;                       /* applied to q.k */
  int32_t sliding_window;            /* > 0: a query at p sees keys at p - window < j <= p */
  float softcap;                     /* > 0: scores = softcap * tanh(scores / softcap) */
  const pglb_weight* sinks;          /* [n_head] sink logits, may be null */
  /* Appended; absent (older struct): 0. PGLB_FEATURE_NON_CAUSAL_ATTENTION:
   * 1: every query sees every key of its sequence (the whole sequence is in
   * the cache: its prompt is one step); a sliding_window with it (only with
   * PGLB_FEATURE_SYMMETRIC_WINDOW_ATTENTION) keeps keys at |p - j| < window. */
  int32_t non_causal;
  /* Appended; absent: 0. 1: the rows of sequences whole in the step
   * (ctx_len == q_len) may be left as they are (PGLB_OP_ATTENTION_KV
   * computes them: MLA's two forms in one step). A hint: computing them is
   * also right. */
  int32_t skip_whole;
  /* Appended; absent: null. One flag per sequence of the batch (host
   * memory, valid until the op returns): 1: PGLB_OP_ATTENTION_KV computes
   * the sequence's rows and this op may leave them (a hint); it overrides
   * skip_whole. PGLB_OP_ATTENTION_KV takes the marked sequences (null: those
   * whole in the step). */
  const uint8_t* kv_seqs;
} pglb_attention_params;

/* PGLB_OP_ATTENTION_KV: causal attention (attn's heads, scale, window,
 * softcap, sinks; its layer and skip_whole unused) over keys and values
 * given in kv, for the sequences attn->kv_seqs marks (null: those whole in
 * the step, ctx_len == q_len); the rows of the others are left as they are.
 * Token t's KV head g is the row kv + (t * n_head_kv + g) * kv_row: its key
 * the first head_dim values, its value v_dim values from v_offset. Token t
 * is the step's t-th, or with context = 1 the t-th of every key of the
 * sequences taken: positions [0, ctx_len) of each, in batch order (the rows
 * PGLB_OP_GATHER_KV gives). out [n_tokens, n_head * v_dim]. */
typedef struct pglb_attention_kv_params {
  size_t struct_size;
  const pglb_attention_params* attn;
  const pglb_buffer* kv;
  int64_t kv_row, v_offset;
  int32_t v_dim;
  int32_t context;                   /* appended; absent: 0 */
} pglb_attention_kv_params;

/* PGLB_OP_GATHER_KV: the layer's cached keys of the sequences `seqs` marks
 * (one flag per sequence of the batch, host memory valid until the op
 * returns), positions [0, ctx_len) of each, sequences in batch order, as F32
 * rows of n_kv_heads * head_dim into out. A marked sequence has no evicted
 * keys. */
typedef struct pglb_gather_kv_params {
  size_t struct_size;
  int32_t layer;
  const uint8_t* seqs;
  pglb_buffer* out;
} pglb_gather_kv_params;

typedef struct pglb_glu_params {
  size_t struct_size;
  const pglb_buffer* gate;
  const pglb_buffer* up;
  int64_t n;                         /* values */
  pglb_activation act;
  pglb_buffer* out;
} pglb_glu_params;

typedef struct pglb_add_params {
  size_t struct_size;
  pglb_buffer* y;
  const pglb_buffer* x;
  int64_t n;                         /* values */
} pglb_add_params;

typedef struct pglb_gather_rows_params {
  size_t struct_size;
  const pglb_buffer* x;
  int64_t dim;
  const int32_t* rows;               /* host memory, valid until the op returns */
  int64_t n_rows;
  pglb_buffer* out;
} pglb_gather_rows_params;

typedef struct pglb_moe_route_params {
  size_t struct_size;
  const pglb_buffer* logits;         /* [n, n_expert] */
  int64_t n;
  int32_t n_expert, k;
  int32_t sigmoid;                   /* scoring: 0 softmax (Mixtral), 1 sigmoid (DeepSeek V3) */
  int32_t normalize;                 /* rescale the k chosen weights to sum to 1 */
  float scale;                       /* applied to the chosen weights last */
  pglb_buffer* ids;                  /* I32 [n, k]; ties go to the lower expert id */
  pglb_buffer* weights;              /* [n, k] */
  /* Appended (older callers leave them zero: no bias, no groups). */
  const pglb_weight* choice_bias;    /* [n_expert] added to the scores for the choice only; may be null */
  int32_t n_group, topk_group;       /* only the topk_group best of n_group expert groups compete (0, 0: none) */
  int32_t group_score_max;           /* a group's rank: 0 the sum of its two best choice scores, 1 its best */
} pglb_moe_route_params;

typedef struct pglb_matmul_experts_params {
  size_t struct_size;
  const pglb_weight* const* experts; /* [n_experts] */
  int32_t n_experts;
  const pglb_buffer* x;
  int64_t n;
  int32_t k;
  int32_t x_per_slot;                /* x[t*k + j] (1) or x[t] (0) */
  const pglb_buffer* ids;
  pglb_buffer* y;                    /* y[t*k + j] = x_row W[ids[t, j]]^T (+ biases[ids[t, j]]) */
  const pglb_weight* const* biases;  /* [n_experts] or null */
} pglb_matmul_experts_params;

typedef struct pglb_moe_combine_params {
  size_t struct_size;
  const pglb_buffer* y;
  const pglb_buffer* weights;
  int64_t n;
  int32_t k;
  int64_t dim;
  pglb_buffer* out;                  /* out[t] = sum_j weights[t, j] y[t*k + j] */
} pglb_moe_combine_params;

typedef struct pglb_scale_rows_sigmoid_params {
  size_t struct_size;
  pglb_buffer* y;                    /* y[t] *= sigmoid(s[t]), rows of dim values */
  const pglb_buffer* s;
  int64_t n, dim;
} pglb_scale_rows_sigmoid_params;

typedef struct pglb_softcap_params {
  size_t struct_size;
  pglb_buffer* x;
  int64_t n;                         /* values */
  float cap;
} pglb_softcap_params;

/* LayerNorm over rows of dim values, population variance; w and b may be null. */
typedef struct pglb_layer_norm_params {
  size_t struct_size;
  const pglb_buffer* x;
  const pglb_weight* w;              /* [dim], may be null (1) */
  const pglb_weight* b;              /* [dim], may be null (0) */
  int64_t n_rows, dim;
  float eps;
  pglb_buffer* y;
} pglb_layer_norm_params;

/* out = act(x) elementwise over n values: SILU, GELU_TANH, GELU_ERF or SIGMOID. */
typedef struct pglb_activation_params {
  size_t struct_size;
  const pglb_buffer* x;
  int64_t n;                         /* values */
  pglb_activation act;
  pglb_buffer* out;
} pglb_activation_params;

/* LoRA: for each row t of x[n, in] with s = slots[t] > 0 (I32; slot 0 adds
 * nothing), y[t] += B[s] (A[s] x[t]); A[s] is [rank, in], B[s] [out, rank],
 * all slots alike (F32, F16 or BF16). Rows of one slot may be computed
 * together (each slot's A and B read once per call). */
typedef struct pglb_lora_matmul_params {
  size_t struct_size;
  const pglb_weight* const* a;       /* [n_slots] */
  const pglb_weight* const* b;       /* [n_slots] */
  int32_t n_slots;
  const pglb_buffer* x;
  int64_t n;
  const pglb_buffer* slots;
  pglb_buffer* y;
} pglb_lora_matmul_params;

/* Per channel c of x [n_tokens, conv_dim]: out = silu(bias[c] + sum_j
 * w[c * K + j] x[t - K + 1 + j][c]), inputs before a sequence's first token
 * this step from its conv state, which then keeps the last K - 1 inputs.
 * w: a vector weight of conv_dim * K values; bias may be null. */
typedef struct pglb_causal_conv1d_params {
  size_t struct_size;
  int32_t layer;
  const pglb_buffer* x;
  const pglb_weight* w;
  const pglb_weight* bias;
  pglb_buffer* out;
} pglb_causal_conv1d_params;

/* Per token and value head h (key head h / (n_v_heads / n_k_heads), or
 * h % n_k_heads when v_heads_tiled), with S the head's state, q and k
 * L2-normalised (eps 1e-6), q scaled:
 * g = ssm_a[h] softplus(a + dt_bias[h]) (ssm_a = -exp(A_log)), beta = sigmoid(b);
 * S = exp(g) S; S += k (beta (v - k^T S))^T; out = q^T S. qkv rows:
 * [q (n_k_heads * head_k_dim), k (same), v (n_v_heads * head_v_dim)]. */
typedef struct pglb_gated_delta_rule_params {
  size_t struct_size;
  int32_t layer;
  const pglb_buffer* qkv;
  const pglb_buffer* a;              /* [n_tokens, n_v_heads] */
  const pglb_buffer* b;              /* [n_tokens, n_v_heads] */
  const pglb_weight* ssm_a;          /* [n_v_heads] */
  const pglb_weight* dt_bias;        /* [n_v_heads] */
  int32_t n_k_heads, n_v_heads, head_k_dim, head_v_dim;
  float scale;
  pglb_buffer* out;                  /* [n_tokens, n_v_heads * head_v_dim] */
  int32_t v_heads_tiled;             /* appended; absent (older struct): 0 */
} pglb_gated_delta_rule_params;

/* One draw. The host draws the random number u (uniform in [0, 1)) from the
 * sequence's own generator, so a seeded request gets the same tokens
 * whichever device samples. Greedy when temperature < 1e-5: the largest
 * finite logit, the lowest id on ties. Otherwise weights exp((l - max) / T)
 * filtered by top_k (<= 0: off), top_p (1: off) and min_p (0: off), in that
 * order, and the first id (ascending) whose cumulative weight exceeds
 * u * total. Non-finite logits are never chosen. */
typedef struct pglb_sample_row {
  int32_t row;                       /* the logits row to draw from */
  float temperature;
  int32_t top_k;
  float top_p, min_p;
  double u;
} pglb_sample_row;

typedef struct pglb_sample_params {
  size_t struct_size;
  const pglb_buffer* logits;         /* [rows, n_vocab] */
  int64_t n_vocab;
  const pglb_sample_row* draws;      /* host memory, valid until the op returns */
  int64_t n_draws;
  pglb_buffer* ids;                  /* I32 [n_draws] */
} pglb_sample_params;

/* What supports_op is asked: an op with the types and shapes of its operands
 * (weights first, then activations; shape[0] is the row length). Asked when
 * a model loads, so a model the device cannot run is refused at start-up
 * and an optional op (softcap, sample) falls back to the host. */
typedef struct pglb_op_query {
  size_t struct_size;
  pglb_op op;
  int32_t n_operands;
  pglb_dtype types[4];
  int64_t shapes[4][4];
} pglb_op_query;

/* ---- the tables */

/* A device communicator (NCCL / HCCL / BKCL style) over device buffers,
 * in stream order. Ranks meet through a unique id that rank 0 makes
 * (comm_unique_id) and the core hands to every rank over its host channel
 * (MPI). A device without one leaves pglb_registry.comm null: the core then
 * copies to the host and uses MPI. Counts are F32 elements. */
typedef struct pglb_comm_iface {
  size_t struct_size;
  pglb_status (*unique_id)(pglb_device* dev, void* id, size_t* id_bytes);  /* id_bytes: in capacity, out used */
  pglb_status (*init)(pglb_device* dev, int32_t rank, int32_t size, const void* id, size_t id_bytes,
                      pglb_comm** out);
  void (*destroy)(pglb_comm* comm);
  /* In place: every rank ends with the element-wise sum. */
  pglb_status (*all_reduce_sum)(pglb_comm* comm, pglb_stream* s, pglb_buffer* buf, size_t offset, size_t count);
  /* out[r * count, (r + 1) * count) = rank r's in[0, count). */
  pglb_status (*all_gather)(pglb_comm* comm, pglb_stream* s, const pglb_buffer* in, size_t count, pglb_buffer* out);
  pglb_status (*broadcast)(pglb_comm* comm, pglb_stream* s, pglb_buffer* buf, size_t count, int32_t root);
  pglb_status (*send)(pglb_comm* comm, pglb_stream* s, const pglb_buffer* buf, size_t count, int32_t dst);
  pglb_status (*recv)(pglb_comm* comm, pglb_stream* s, pglb_buffer* buf, size_t count, int32_t src);
} pglb_comm_iface;

/* Work in order on one stream. */
typedef struct pglb_stream_iface {
  size_t struct_size;
  /* Copies of `bytes` at byte `offset` of the buffer. The host memory must
   * stay valid (from_host) or is filled (to_host) only once the stream is
   * synchronized. */
  pglb_status (*copy_from_host)(pglb_stream* s, const void* src, pglb_buffer* dst, size_t offset, size_t bytes);
  pglb_status (*copy_to_host)(pglb_stream* s, const pglb_buffer* src, size_t offset, size_t bytes, void* dst);
  pglb_status (*synchronize)(pglb_stream* s);
  /* The step's metadata, used by embed, rope, store_kv and attention. The
   * caller keeps it unchanged until the next set_batch. */
  pglb_status (*set_batch)(pglb_stream* s, const pglb_batch* batch);
  /* One op; params points to the op's own parameter struct. */
  pglb_status (*enqueue)(pglb_stream* s, pglb_op op, const void* params);
  /* Whole KV blocks (all layers, K and V): copy-on-write, and with
   * PGLB_FEATURE_SWAP_TO_HOST the host pool's blocks out and in. */
  pglb_status (*copy_blocks)(pglb_stream* s, const pglb_block_pair* pairs, size_t n);
  pglb_status (*swap_out)(pglb_stream* s, const pglb_block_pair* device_to_host, size_t n);
  pglb_status (*swap_in)(pglb_stream* s, const pglb_block_pair* host_to_device, size_t n);
  /* Events: a point in this stream, and a wait for one (of any stream of
   * the device) before the work enqueued after it. */
  pglb_status (*event_record)(pglb_stream* s, pglb_event* e);
  pglb_status (*event_wait)(pglb_stream* s, pglb_event* e);
  /* PGLB_FEATURE_LINEAR_ATTENTION: whole state slots (a forked sequence's). */
  pglb_status (*copy_states)(pglb_stream* s, const pglb_block_pair* pairs, size_t n);
  /* PGLB_FEATURE_KV_BLOCK_IO: whole KV blocks as bytes in host memory, the
   * KV spec's bytes per block each (every layer slot's K, V and int8 scales,
   * in the device's own order), back to back in the blocks' order. Done when
   * the call returns. Writing a block's bytes back into any block gives it
   * the same contents. */
  pglb_status (*read_kv_blocks)(pglb_stream* s, const int32_t* blocks, size_t n, void* dst);
  pglb_status (*write_kv_blocks)(pglb_stream* s, const int32_t* blocks, size_t n, const void* src);
} pglb_stream_iface;

typedef struct pglb_device_iface {
  size_t struct_size;
  void (*close)(pglb_device* dev);
  const char* (*describe)(pglb_device* dev);    /* device, kernels, threads: one line for logs */
  const char* (*last_error)(pglb_device* dev);  /* the message of the last failed call */
  pglb_status (*memory_info)(pglb_device* dev, pglb_memory_info* out);
  uint64_t (*features)(pglb_device* dev);       /* PGLB_FEATURE_* bits */
  pglb_status (*set_deterministic)(pglb_device* dev, int32_t on);
  int32_t (*supports_op)(pglb_device* dev, const pglb_op_query* q);
  /* Weights: matrices [rows = out features, cols = in features] and
   * vectors (norms, biases), which are held as F32. */
  int32_t (*supports_weight)(pglb_device* dev, pglb_dtype type);
  pglb_status (*weight_upload)(pglb_device* dev, const pglb_tensor* t, pglb_weight** out, pglb_weight_info* info);
  void (*weight_free)(pglb_device* dev, pglb_weight* w);
  /* Buffer types and buffers. */
  int32_t (*buffer_type_count)(pglb_device* dev);
  pglb_status (*buffer_type_info)(pglb_device* dev, int32_t type, pglb_buffer_type_info* out);
  pglb_status (*buffer_alloc)(pglb_device* dev, int32_t type, pglb_dtype dtype, size_t count, pglb_buffer** out);
  void (*buffer_free)(pglb_device* dev, pglb_buffer* buf);
  /* The KV cache (and its host swap pool). */
  pglb_status (*kv_allocate)(pglb_device* dev, const pglb_kv_spec* spec);
  pglb_status (*swap_allocate)(pglb_device* dev, int32_t num_blocks);
  /* Streams and events. */
  pglb_status (*stream_create)(pglb_device* dev, pglb_stream** out);
  void (*stream_destroy)(pglb_device* dev, pglb_stream* s);
  pglb_status (*event_create)(pglb_device* dev, pglb_event** out);
  pglb_status (*event_synchronize)(pglb_device* dev, pglb_event* e);
  void (*event_destroy)(pglb_device* dev, pglb_event* e);
  /* Optional per-op timing (--profile). report: NUL-terminated, owned by the device. */
  void (*set_profiling)(pglb_device* dev, int32_t on);
  const char* (*profile_report)(pglb_device* dev);
} pglb_device_iface;

/* What the entry point returns. */
typedef struct pglb_registry {
  size_t struct_size;
  uint32_t abi_version;        /* PGLB_ABI_VERSION the plugin was built with */
  const char* kind;            /* the device kind it serves: "opencl" (--device opencl:N) */
  const char* description;     /* one line for `pagellm info --devices` */
  /* Both are handed the registry itself (as ggml's registry functions are),
   * so one library may serve several registries through `context`. */
  int32_t (*device_count)(const struct pglb_registry* reg);
  /* Opens device `index`. On failure writes a NUL-terminated message of at
   * most error_len bytes to `error`. */
  pglb_status (*device_open)(const struct pglb_registry* reg, int32_t index, const pglb_options* options,
                             pglb_device** out, char* error, size_t error_len);
  const pglb_device_iface* device;
  const pglb_stream_iface* stream;
  const pglb_comm_iface* comm;  /* may be null: collectives go through the host */
  void* context;                /* the plugin's own, never read by the core */
} pglb_registry;

typedef const pglb_registry* (*pglb_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* PAGELLM_BACKEND_H */
