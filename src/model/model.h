// A loaded decoder-only transformer: its config, its weights on a backend, and
// one forward pass over a batch of sequences that reads and writes the paged KV
// cache. Families differ by config flags, by the tensors their table
// (model/arch.h) lists and, when they have one, by their own layer function;
// the shared blocks are model/blocks.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "model/shard.h"

namespace pagellm::dist {
class Communicator;
}

namespace pagellm {

class GGUFFile;
class TensorSource;

// Reports loading progress: (tensors done, tensors total).
using LoadProgress = std::function<void(size_t, size_t)>;

class Model {
 public:
  // `path`: a GGUF file or a Hugging Face folder (config.json + safetensors).
  // With a shard, only this rank's part of each tensor it needs is mapped
  // and uploaded (model/shard.h).
  static std::unique_ptr<Model> load(const std::string& path, Backend& backend, const LoadProgress& progress = {},
                                     const ModelShard& shard = {});
  // From an already-open source (used by the dummy loader and tests).
  static std::unique_ptr<Model> from_source(const ModelConfig& cfg, const TensorSource& src, Backend& backend,
                                            const LoadProgress& progress = {}, const ModelShard& shard = {});
  ~Model();

  // The whole model's config; the shard's local sizes are in geometry().
  const ModelConfig& config() const { return cfg_; }
  const ModelShard& shard() const { return shard_; }
  const ShardGeometry& geometry() const { return geo_; }
  // The tensor-parallel group (tp_size ranks, this one at tp_rank): needed
  // before the first forward pass when tp_size > 1.
  // Its all-reduces run on device buffers through the backend's own
  // communicator when it has one (dist/device_comm.h), else through the host.
  void set_tp_communicator(dist::Communicator* comm);
  Backend& backend() { return backend_; }
  // The longest context the model will serve. LongRoPE models take their
  // long factor set beyond the original context, the short one within it
  // (llama.cpp's rule); until this is called, the trained context decides.
  void set_context_length(int n_ctx);
  // Bytes of weights as stored in the file, and as the backend holds them
  // (more when it converts a type it cannot multiply).
  size_t weight_bytes() const { return weight_bytes_; }
  size_t held_weight_bytes() const { return held_weight_bytes_; }
  // Bytes of activation buffers for a step of n_tokens tokens and n_logits
  // sampled rows (KV sizing on device backends subtracts it).
  size_t activation_bytes(int64_t n_tokens, int64_t n_logits) const;
  // Bytes one decode step streams from memory: every weight but the token
  // embedding table, of which it reads one row (unless it doubles as the
  // output matrix), and of the experts only the n_expert_used a token routes to.
  size_t decode_weight_bytes() const {
    const size_t all = output_ ? weight_bytes_ - tok_embd_bytes_ : weight_bytes_;
    if (!cfg_.moe()) return all;
    return all - expert_bytes_ + expert_bytes_ / cfg_.n_expert * cfg_.n_expert_used;
  }
  // Shape of the paged KV cache this model (shard) needs: its layers, its KV
  // heads; with a grouped plan (KV-cache groups of the whole model), the
  // slots and the layer -> (group, slot) map of this stage's layers.
  // Linear-attention layers (Qwen3.5) keep no K/V: they take no slot, and
  // each gets state_slots per-sequence states (KVCacheSpec::state).
  KVCacheSpec kv_cache_spec(int block_size, int num_blocks, DType dtype, const KvGroupPlan* groups = nullptr,
                            int state_slots = 0) const;
  // Whether the model has linear-attention layers, and the bytes of one
  // sequence's state over this stage's.
  bool has_linear_layers() const { return cfg_.n_linear_layers() > 0; }
  size_t state_bytes_per_seq() const { return kv_cache_spec(16, 2, DType::F32, nullptr, 1).state.bytes_per_slot(); }
  // Per cache layer of the whole model (each layer that keeps its own K/V,
  // ModelConfig::kv_source): 0 for full attention, else its sliding window.
  std::vector<int32_t> kv_layer_windows() const;
  // A tensor of the model's file by its GGUF name, as the file holds it (host
  // memory, valid while the model lives), or null: what the forward pass does
  // not upload, such as BERT's sequence-classification head ("cls.weight",
  // "cls.bias", "cls.output.weight", "cls.output.bias").
  const TensorData* file_tensor(const std::string& gguf_name) const;
  // An encoder with two or more token types (BERT's pairs): the token after
  // whose first occurrence in a sequence its tokens are type 1 (the
  // tokenizer's pair separator, [SEP]); -1 (the default): all type 0.
  void set_segment_separator(int32_t token) { segment_separator_ = token; }
  // The GGUF file the model came from (its tokenizer metadata), or null.
  const GGUFFile* gguf() const { return gguf_.get(); }
  // The tensors the model was loaded from (a score head's rows), or null
  // when the caller's source was borrowed (from_source).
  const TensorSource* tensors() const { return source_.get(); }

  // One forward pass. The KV cache must be allocated on the backend. Writes
  // the logits of the batch rows listed in logits_rows to `logits`
  // ([logits_rows.size(), n_vocab], host memory).
  void forward(const BatchInfo& batch, const std::vector<int32_t>& logits_rows, float* logits);

  // The same pass in the pieces a pipeline stage runs: begin_pass, then
  // embed (first stage) or hidden_from_host (the previous stage's output),
  // run_layers over this stage's layers, then hidden_to_host (to the next
  // stage) or compute_logits (last stage). Hidden states are [n, n_embd].
  void begin_pass(const BatchInfo& batch, int64_t n_logits);
  void embed();
  void run_layers();
  void hidden_to_host(float* out);
  Buffer& hidden_states() { return *buf_.x; }  // [n, n_embd] of the pass begun (pipeline sends)
  // Per-layer inputs (Gemma 4 E2B / E4B): the first stage computes every
  // layer's from the input embedding; the next stages receive them with the
  // hidden states. Null without them; else [n, n_layer * n_embd_per_layer].
  Buffer* per_layer_input_buffer() { return cfg_.n_embd_per_layer > 0 ? buf_.ple.get() : nullptr; }
  int64_t per_layer_input_values() const { return n_ * cfg_.n_layer * cfg_.n_embd_per_layer; }
  void hidden_from_host(const float* in);
  void compute_logits(const std::vector<int32_t>& logits_rows, float* logits);
  // The same in two halves: the logits stay in backend memory, then either
  // the host reads them or the backend samples from them, so that only token
  // ids cross to the host (a device backend need not copy a vocabulary's
  // logits per row).
  void compute_logits(const std::vector<int32_t>& logits_rows);
  void read_logits(float* logits);
  // Pooling: the final hidden states (after the output norm: what the
  // output matrix multiplies) of the batch rows listed, [rows.size(),
  // n_embd] to `out`. Normalises the pass's hidden states in place, so it
  // comes after compute_logits / sample_on_device.
  void final_hidden(const std::vector<int32_t>& rows, float* out);
  // One rank, and the backend has the sample op (and softcap where the model
  // caps its logits).
  bool can_sample_on_device() const;
  // ids[i]: the token draws[i] picks from its row of the logits computed
  // last (-1: a row with no finite logit).
  void sample_on_device(const std::vector<SampleDraw>& draws, int32_t* ids);
  // LoRA adapters (model/lora.h): device slots for max_loras adapters of
  // rank <= max_rank, then a pass applies each sequence's SeqInfo::lora_slot
  // (0: none). Throws Error for a family whose layers do not run the shared
  // attention / FFN blocks, and for a sharded model.
  // dtype: the slots' (F32, F16, BF16); nullopt: F32 over F32 weights, else F16.
  void enable_lora(int32_t max_loras, int32_t max_rank, std::optional<DType> dtype = std::nullopt);
  const LoraSlots* lora_slots() const { return lora_.get(); }
  // Slot 1..max_loras takes the adapter's matrices (null: empties it).
  void set_lora_slot(int32_t slot, const LoraAdapter* adapter);
  // Per layer and LoRA target: the base weight's (rows, cols), (0, 0) where
  // the layer has no such projection of its own (MoE, linear attention).
  LoraSlots::Shapes lora_shapes() const;

  // Frees the activation buffers, which grow to the largest step so far; the
  // next pass allocates what it needs. For an idle engine after a burst.
  void release_buffers();

 private:
  Model(const ModelConfig& cfg, Backend& backend, const ModelShard& shard);
  void load_weights(const TensorSource& src, const LoadProgress& progress);
  void ensure_buffers(int64_t n_tokens, int64_t n_logits);
  void per_layer_inputs();  // buf_.ple from the embedded tokens (Gemma 4)
  void plan_mla(const BatchInfo& batch);  // mla_plan_ for the pass
  int64_t mla_context_cap() const;        // rows of the expanded form's context buffers (0: none)
  int64_t mla_context_row_values() const;
  void ensure_mla_context_buffers();
  void fill_head_routes(Buffer& ids, int64_t rows);
  using Buffers = ActivationBuffers;
  struct BufferShape {
    std::unique_ptr<Buffer> Buffers::*member;
    int64_t values;  // per token, or per sampled row; 0: not used by this model
    bool per_token;
    DType type = DType::F32;
  };
  std::vector<BufferShape> buffer_shapes() const;
  std::unique_ptr<Weight>& slot(Slot s, int il);
  std::vector<std::unique_ptr<Weight>>& expert_slot(Slot s, int il);
  // Copies of a buffer's first `values` floats, waited for.
  void to_host(const Buffer& buf, int64_t values, float* dst);
  void from_host(const float* src, Buffer& buf, int64_t values);
  // Tensor parallel: the sum over ranks of buf's first `values` floats.
  void all_reduce(Buffer& buf, int64_t values);
  // Vocabulary-parallel rows ([n, width]): each token's from the rank that holds it.
  void sum_token_owners(Buffer& buf, int64_t width);

  ModelConfig cfg_;
  Backend& backend_;
  ModelShard shard_;
  ShardGeometry geo_;
  dist::Communicator* tp_comm_ = nullptr;
  std::unique_ptr<DeviceComm> tp_device_comm_;  // the same group on device buffers
  std::vector<AlignedBuffer> shard_storage_;  // column slices cut at load (the weights may borrow them)
  int64_t n_ = 0;                             // tokens of the pass begun
  BatchInfo tp_batch_;                        // the batch with token ids local to this rank's vocabulary
  std::vector<int32_t> local_ids_;            // ... or -1 for a token another rank's slice holds
  std::vector<float> host_, gather_;          // host staging for collectives
  std::vector<float> local_logits_;           // this rank's vocabulary columns of the logits
  int64_t logits_rows_ = 0;                   // rows of the logits computed last
  bool softcap_on_device_ = false;            // the final softcap runs as the backend's op (one rank)
  std::unique_ptr<GGUFFile> gguf_;  // keeps the mapping alive for borrowed weights
  std::unique_ptr<TensorSource> source_;
  std::unique_ptr<TensorSource> derived_;  // the family's derived weights (the weights may borrow them)
  size_t weight_bytes_ = 0;
  size_t held_weight_bytes_ = 0;
  size_t tok_embd_bytes_ = 0;
  size_t expert_bytes_ = 0;  // routed experts' weights (all of them)

  std::unique_ptr<Weight> tok_embd_;     // [n_vocab, n_embd]
  std::unique_ptr<Weight> output_norm_;  // [n_embd]
  std::unique_ptr<Weight> output_;       // [n_vocab, n_embd]; null when tied to tok_embd_
  std::unique_ptr<Weight> rope_freqs_;   // [n_rot / 2], optional
  std::unique_ptr<Weight> rope_short_, rope_long_;  // LongRoPE factor sets [n_rot / 2], optional
  // Per-layer embeddings (Gemma 4): the table [n_vocab, n_layer * P], the
  // input embedding's projection [n_layer * P, n_embd] and its norm [P].
  std::unique_ptr<Weight> ple_tok_embd_, ple_model_proj_, ple_proj_norm_;
  // Encoders (BERT): the embeddings' LayerNorm, and on the host the learned
  // position table [n_ctx_train, n_embd] and the token-type table [types,
  // n_embd] (added to each token's embedding by its position and segment: a
  // small host copy rather than a backend op), and the pass's positions and
  // segments.
  std::unique_ptr<Weight> tok_norm_, tok_norm_b_;
  std::vector<float> pos_table_, type_table_;
  std::vector<int32_t> positions_, segments_;
  int32_t segment_separator_ = -1;
  void add_positions();
  void find_segments(const BatchInfo& batch);
  std::vector<LayerWeights> layers_;
  std::unique_ptr<LoraSlots> lora_;
  bool lora_pass_ = false;                // a row of the pass begun has an adapter
  MlaPlan mla_plan_;                      // LayerPass::mla of the pass begun
  int attention_kv_ = -1;                 // the backend runs attention_kv (asked once; -1: not yet)
  int gather_kv_ = -1;                    // ... and gather_kv
  int context_len_ = 0;                   // set_context_length's: the longest sequence
  std::vector<int32_t> lora_row_slots_;   // its rows' slots

  Buffers buf_;  // activations, grown on demand
};

}  // namespace pagellm
