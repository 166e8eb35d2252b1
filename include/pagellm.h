/* pagellm.h: the pagellm engine as a C library (libpagellm.so).
 *
 * One engine holds one model and runs its step loop (continuous batching over
 * the paged KV cache) on its own thread. Requests go in from any thread;
 * their outputs come back either by polling one engine-wide queue
 * (pagellm_add_request + pagellm_next_output) or through a callback per output
 * (pagellm_generate, which blocks its caller until the request finishes).
 *
 * Conventions
 * - Handles are opaque. No C++ type or exception crosses this boundary.
 * - Functions that can fail return a pagellm_status; on failure,
 *   pagellm_last_error() holds the message (per thread, valid until the next
 *   failing call on that thread).
 * - Options and sampling parameters are JSON objects with vLLM's names; see
 *   docs/embedding.md. NULL means "all defaults".
 * - Strings are UTF-8 and NUL-terminated; generated text may hold a NUL byte,
 *   so lengths are given where that matters. A string argument that is not
 *   valid UTF-8 (model, prompt, request id, tokenizer text) is
 *   PAGELLM_ERR_INVALID_ARGUMENT; the message names it and the first bad byte.
 * - Thread safety is stated per function. "Any thread" means concurrent calls
 *   on the same engine are safe.
 *
 * ABI: symbols are versioned (PAGELLM_1). PAGELLM_ABI_VERSION changes when a
 * declaration here changes incompatibly; compare it with pagellm_abi_version()
 * at run time.
 */
#ifndef PAGELLM_H
#define PAGELLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PAGELLM_ABI_VERSION 1

typedef struct pagellm_engine pagellm_engine;
typedef struct pagellm_output pagellm_output;

typedef enum pagellm_status {
  PAGELLM_OK = 0,
  PAGELLM_TIMEOUT = 1,                /* pagellm_next_output: nothing arrived in time */
  PAGELLM_ERR_INVALID_ARGUMENT = -1,  /* bad options, sampling values, prompt, NULL handle */
  PAGELLM_ERR_LOAD = -2,              /* the model could not be loaded */
  PAGELLM_ERR_BUSY = -3,              /* the engine's queue is full: try again later */
  PAGELLM_ERR_SHUTTING_DOWN = -4,     /* the engine no longer accepts requests */
  PAGELLM_ERR_BUFFER_TOO_SMALL = -5,  /* the size needed was written to the size argument */
  PAGELLM_ERR_INTERNAL = -6           /* anything else (a bug: please report it) */
} pagellm_status;

/* ---- library (any thread) */

/* PAGELLM_ABI_VERSION of the library loaded at run time. */
uint32_t pagellm_abi_version(void);
/* "0.1.0" */
const char* pagellm_version(void);
/* The message of this thread's last failed call ("" when none). */
const char* pagellm_last_error(void);
/* "ok", "timeout", "invalid argument", ... */
const char* pagellm_status_string(pagellm_status status);

/* ---- engine */

/* Loads `model` (a GGUF file or a Hugging Face folder; NULL or "": the default
 * model) with `options_json` (vLLM's engine arguments: {"max_model_len": 2048,
 * "max_num_seqs": 64, "seed": 0, ...}; NULL: defaults). On success *out is the
 * engine. Any thread; blocks while loading. */
pagellm_status pagellm_engine_create(const char* model, const char* options_json, pagellm_engine** out);

/* Aborts what is still running and frees the engine. No other call on this
 * engine may run at the same time or after. NULL is ignored. */
void pagellm_engine_destroy(pagellm_engine* engine);

/* Longest sequence (prompt + output) and vocabulary size. Any thread. */
int32_t pagellm_engine_max_model_len(const pagellm_engine* engine);
int32_t pagellm_engine_vocab_size(const pagellm_engine* engine);
/* The length of the vectors pagellm_embed writes (the model's hidden size). Any thread. */
int32_t pagellm_engine_embedding_size(const pagellm_engine* engine);

/* ---- requests */

/* Queues one request; its outputs go to the engine's queue (pagellm_next_output).
 * The prompt is `prompt` (text, tokenized with BOS as the model wants) or, when
 * `prompt` is NULL, the `num_prompt_tokens` ids at `prompt_token_ids`.
 * `sampling_json`: vLLM's SamplingParams fields ({"temperature": 0,
 * "max_tokens": 32, "stop": ["\n"], "n": 2, "logprobs": 1, ...}; NULL: vLLM's
 * defaults, 16 tokens at temperature 1). `request_id` must be unique among
 * unfinished requests. Any thread. */
pagellm_status pagellm_add_request(pagellm_engine* engine, const char* request_id, const char* prompt,
                                   const int32_t* prompt_token_ids, size_t num_prompt_tokens,
                                   const char* sampling_json);

/* Waits up to `timeout_ms` (< 0: forever) for the next output of any request
 * added with pagellm_add_request; *out then owns it (free with
 * pagellm_output_free). Returns PAGELLM_TIMEOUT when none came. Each request
 * delivers outputs in order; its last one is finished. Any thread (each
 * output goes to one caller). */
pagellm_status pagellm_next_output(pagellm_engine* engine, int32_t timeout_ms, pagellm_output** out);

/* Stops a request: its KV blocks are freed within one step and its last
 * output (finish reason "abort") is delivered as usual. Unknown or finished
 * ids are ignored. Any thread. */
pagellm_status pagellm_abort(pagellm_engine* engine, const char* request_id);

/* Called with each output of a pagellm_generate request, on the caller's
 * thread. The output is valid during the call only. Return non-zero to abort
 * the request (one more, final output follows). */
typedef int (*pagellm_output_callback)(const pagellm_output* output, void* user_data);

/* Runs one request to the end, calling `callback` (may be NULL) with every
 * output as it arrives (streaming). The prompt and sampling are as for
 * pagellm_add_request; the request id is made up. Returns PAGELLM_OK when the
 * request finished (also when aborted by the callback); a request that fails
 * in the engine returns PAGELLM_ERR_INTERNAL with its message. Any thread;
 * many threads may generate at once and share the engine's batches. */
pagellm_status pagellm_generate(pagellm_engine* engine, const char* prompt, const int32_t* prompt_token_ids,
                                size_t num_prompt_tokens, const char* sampling_json,
                                pagellm_output_callback callback, void* user_data);

/* An embedding request: the prompt (text when `prompt` is not NULL, else the
 * token ids) runs prefill only, beside whatever else the engine runs, and its
 * final hidden states are pooled as the model says (sentence-transformers
 * files, a GGUF's pooling_type) or as the pooling / normalize options
 * override. Blocks until done, then writes pagellm_engine_embedding_size()
 * floats to `embedding` and that count to *dim; with less `capacity` it
 * returns PAGELLM_ERR_BUFFER_TOO_SMALL (and *dim) before running anything.
 * A bad prompt is PAGELLM_ERR_INVALID_ARGUMENT. Any thread. */
pagellm_status pagellm_embed(pagellm_engine* engine, const char* prompt, const int32_t* prompt_token_ids,
                             size_t num_prompt_tokens, float* embedding, size_t capacity, size_t* dim);

/* ---- LoRA adapters (engine option "enable_lora": true; see the README's "LoRA adapters") */

/* Serves the adapter at `path` (a PEFT folder or a GGUF LoRA file) as `name`;
 * a request then selects it with "lora": "<name>" in its sampling_json.
 * PAGELLM_ERR_INVALID_ARGUMENT for a taken name, a missing file or one that
 * does not fit the model, or an engine without enable_lora. Any thread. */
pagellm_status pagellm_load_lora_adapter(pagellm_engine* engine, const char* name, const char* path);
/* Stops serving `name` (requests using it finish with it);
 * PAGELLM_ERR_INVALID_ARGUMENT for an unknown name. Any thread. */
pagellm_status pagellm_unload_lora_adapter(pagellm_engine* engine, const char* name);

/* A score request (a reranker's: a model with a score head, see the README's
 * "Rerank and score"): the (query, document) pair becomes one prompt as the
 * model's score format says, runs prefill only, and its score (the score
 * label's probability) goes to *score. Blocks until done. A model without a
 * score head, or a pair over the context, is PAGELLM_ERR_INVALID_ARGUMENT.
 * Any thread. */
pagellm_status pagellm_score(pagellm_engine* engine, const char* query, const char* document, float* score);

/* Requests added and not yet finished (pagellm_generate's included). Any thread. */
size_t pagellm_num_unfinished(const pagellm_engine* engine);

/* ---- outputs: what one request produced since its previous output. The
 * accessors read the output only; an output may be read from any thread but
 * freed once. Pointers live as long as the output. */

void pagellm_output_free(pagellm_output* output);
const char* pagellm_output_request_id(const pagellm_output* output);
/* 1 for the request's last output, else 0. */
int pagellm_output_finished(const pagellm_output* output);
/* The engine's message when the request failed (the last output), else NULL. */
const char* pagellm_output_error(const pagellm_output* output);
int32_t pagellm_output_num_prompt_tokens(const pagellm_output* output);
/* Prompt tokens found in the prefix cache. */
int32_t pagellm_output_num_cached_tokens(const pagellm_output* output);

/* The samples with news in this output (with n > 1, each sample has an index
 * in [0, n)). i in [0, pagellm_output_num_completions). */
size_t pagellm_output_num_completions(const pagellm_output* output);
int32_t pagellm_output_index(const pagellm_output* output, size_t i);
/* The new text; *length (may be NULL) gets its size in bytes. */
const char* pagellm_output_text(const pagellm_output* output, size_t i, size_t* length);
/* The new token ids; *count gets how many. */
const int32_t* pagellm_output_token_ids(const pagellm_output* output, size_t i, size_t* count);
/* Log-probabilities of the new tokens, when the request asked for logprobs
 * (else NULL and *count 0). */
const float* pagellm_output_logprobs(const pagellm_output* output, size_t i, size_t* count);
/* "stop", "length" or "abort" when this sample finished, else NULL. */
const char* pagellm_output_finish_reason(const pagellm_output* output, size_t i);
/* Tokens this sample has generated in all. */
int32_t pagellm_output_num_output_tokens(const pagellm_output* output, size_t i);

/* ---- tokenizer (any thread) */

/* Text -> token ids (add_special != 0: BOS as the model wants). Writes up to
 * `capacity` ids and sets *count to the number of ids; when they do not fit,
 * returns PAGELLM_ERR_BUFFER_TOO_SMALL (call again with *count). */
pagellm_status pagellm_tokenize(const pagellm_engine* engine, const char* text, int add_special, int32_t* ids,
                                size_t capacity, size_t* count);

/* Token ids -> text (skip_special != 0: leave out special tokens). Writes the
 * text and a NUL when `capacity` allows and sets *length to the text's size
 * (without the NUL); returns PAGELLM_ERR_BUFFER_TOO_SMALL when length + 1 >
 * capacity. */
pagellm_status pagellm_detokenize(const pagellm_engine* engine, const int32_t* ids, size_t count, int skip_special,
                                  char* text, size_t capacity, size_t* length);

#ifdef __cplusplus
}
#endif

#endif /* PAGELLM_H */
