/* The C API from C: generate, streaming, polling, abort, n > 1, logprobs,
 * tokenizer round trips, concurrent callers and every error path.
 * Usage: pagellm_capi_test MODEL.gguf [PLUGIN.so] (stories260K; the C11 test
 * backend plugin, device cscalar); exit 77 when the model is missing. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagellm.h"

static int failures = 0;

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, \
              __LINE__, #cond, pagellm_last_error());                           \
      ++failures;                                                               \
    }                                                                           \
  } while (0)

#define GREEDY "{\"temperature\": 0, \"max_tokens\": 24, \"ignore_eos\": true}"

/* ---- what a streamed request produced */
typedef struct {
  char text[4096];
  size_t text_len;
  int32_t tokens[512];
  size_t num_tokens;
  int calls;
  int finished;
  char finish_reason[16];
  int abort_after; /* > 0: ask to abort after this many calls */
} collected;

static void collect(collected* c, const pagellm_output* o) {
  size_t len = 0, n = 0;
  const char* text = pagellm_output_text(o, 0, &len);
  const int32_t* ids = pagellm_output_token_ids(o, 0, &n);
  if (c->text_len + len < sizeof c->text) {
    memcpy(c->text + c->text_len, text, len);
    c->text_len += len;
    c->text[c->text_len] = '\0';
  }
  for (size_t i = 0; i < n && c->num_tokens < 512; ++i) c->tokens[c->num_tokens++] = ids[i];
  const char* reason = pagellm_output_finish_reason(o, 0);
  if (reason) snprintf(c->finish_reason, sizeof c->finish_reason, "%s", reason);
  c->finished = pagellm_output_finished(o);
  ++c->calls;
}

static int on_output(const pagellm_output* o, void* user) {
  collected* c = (collected*)user;
  collect(c, o);
  return c->abort_after > 0 && c->calls >= c->abort_after;
}

static void test_errors_without_engine(const char* model) {
  pagellm_engine* e = (pagellm_engine*)0x1;
  CHECK(pagellm_abi_version() == PAGELLM_ABI_VERSION);
  CHECK(strlen(pagellm_version()) > 0);
  CHECK(strcmp(pagellm_status_string(PAGELLM_ERR_BUSY), "busy") == 0);

  CHECK(pagellm_engine_create(model, "{not json", &e) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(e == NULL);
  CHECK(strstr(pagellm_last_error(), "not valid JSON") != NULL);
  CHECK(pagellm_engine_create(model, "{\"max_num_seqz\": 4}", &e) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(strstr(pagellm_last_error(), "max_num_seqz") != NULL);
  CHECK(pagellm_engine_create(model, "{\"block_size\": 5}", &e) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(pagellm_engine_create("/nonexistent/model.gguf", NULL, &e) == PAGELLM_ERR_LOAD);
  CHECK(strlen(pagellm_last_error()) > 0);
  CHECK(pagellm_engine_create(model, NULL, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(pagellm_engine_create("/models/\xff" "bad.gguf", NULL, &e) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(e == NULL);
  CHECK(strstr(pagellm_last_error(), "'model' is not valid UTF-8") != NULL);
  pagellm_engine_destroy(NULL);
}

static void test_tokenizer(pagellm_engine* e) {
  int32_t ids[64];
  size_t n = 0, len = 0;
  char text[256];
  CHECK(pagellm_tokenize(e, "Once upon a time", 1, ids, 64, &n) == PAGELLM_OK);
  CHECK(n > 2);
  CHECK(pagellm_tokenize(e, "Once upon a time", 1, ids, 1, &n) == PAGELLM_ERR_BUFFER_TOO_SMALL);
  CHECK(n > 2); /* the size needed */
  CHECK(pagellm_detokenize(e, ids, n, 1, text, sizeof text, &len) == PAGELLM_OK);
  CHECK(strstr(text, "Once upon a time") != NULL); /* SentencePiece may keep a leading space */
  CHECK(len == strlen(text));
  const size_t full = len;
  CHECK(pagellm_detokenize(e, ids, n, 1, text, 3, &len) == PAGELLM_ERR_BUFFER_TOO_SMALL);
  CHECK(len == full);
  ids[0] = 1 << 30;
  CHECK(pagellm_detokenize(e, ids, 1, 1, text, sizeof text, &len) == PAGELLM_ERR_INVALID_ARGUMENT);
}

/* Streaming through the callback, and the same request polled: the same tokens. */
static void test_generate_and_poll(pagellm_engine* e) {
  collected streamed;
  memset(&streamed, 0, sizeof streamed);
  CHECK(pagellm_generate(e, "Once upon a time", NULL, 0, GREEDY, on_output, &streamed) == PAGELLM_OK);
  CHECK(streamed.finished);
  CHECK(streamed.num_tokens == 24);
  CHECK(streamed.calls > 1); /* streamed, not one final output */
  CHECK(strcmp(streamed.finish_reason, "length") == 0);

  collected polled;
  memset(&polled, 0, sizeof polled);
  CHECK(pagellm_add_request(e, "poll-1", "Once upon a time", NULL, 0, GREEDY) == PAGELLM_OK);
  while (!polled.finished) {
    pagellm_output* o = NULL;
    pagellm_status s = pagellm_next_output(e, 10000, &o);
    CHECK(s == PAGELLM_OK);
    if (s != PAGELLM_OK) break;
    CHECK(strcmp(pagellm_output_request_id(o), "poll-1") == 0);
    CHECK(pagellm_output_error(o) == NULL);
    CHECK(pagellm_output_num_prompt_tokens(o) > 0);
    collect(&polled, o);
    pagellm_output_free(o);
  }
  CHECK(polled.num_tokens == streamed.num_tokens);
  CHECK(memcmp(polled.tokens, streamed.tokens, streamed.num_tokens * sizeof(int32_t)) == 0);
  CHECK(strcmp(polled.text, streamed.text) == 0);

  /* The same prompt as token ids. */
  int32_t ids[64];
  size_t n = 0;
  CHECK(pagellm_tokenize(e, "Once upon a time", 1, ids, 64, &n) == PAGELLM_OK);
  collected by_ids;
  memset(&by_ids, 0, sizeof by_ids);
  CHECK(pagellm_generate(e, NULL, ids, n, GREEDY, on_output, &by_ids) == PAGELLM_OK);
  CHECK(by_ids.num_tokens == streamed.num_tokens);
  CHECK(memcmp(by_ids.tokens, streamed.tokens, streamed.num_tokens * sizeof(int32_t)) == 0);

  pagellm_output* none = NULL;
  CHECK(pagellm_next_output(e, 10, &none) == PAGELLM_TIMEOUT);
  CHECK(none == NULL);
}

static void test_abort(pagellm_engine* e) {
  /* A callback that asks to stop ends the request with "abort". */
  collected c;
  memset(&c, 0, sizeof c);
  c.abort_after = 2;
  CHECK(pagellm_generate(e, "Once", NULL, 0, "{\"max_tokens\": 200, \"ignore_eos\": true, \"seed\": 3}", on_output,
                         &c) == PAGELLM_OK);
  CHECK(c.finished);
  CHECK(strcmp(c.finish_reason, "abort") == 0);
  CHECK(c.num_tokens < 200);

  /* pagellm_abort on a polled request. */
  CHECK(pagellm_add_request(e, "to-abort", "Once", NULL, 0, "{\"max_tokens\": 240, \"ignore_eos\": true}") ==
        PAGELLM_OK);
  /* An id in flight cannot be used again (checked here, on a long request:
   * a short one may be done before the second call). */
  CHECK(pagellm_add_request(e, "to-abort", "Once", NULL, 0, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(strstr(pagellm_last_error(), "duplicate") != NULL);
  int finished = 0, aborted = 0, outputs = 0;
  while (!finished) {
    pagellm_output* o = NULL;
    if (pagellm_next_output(e, 10000, &o) != PAGELLM_OK) {
      CHECK(0);
      break;
    }
    if (++outputs == 1) CHECK(pagellm_abort(e, "to-abort") == PAGELLM_OK);
    finished = pagellm_output_finished(o);
    const char* reason = pagellm_output_finish_reason(o, 0);
    if (reason && strcmp(reason, "abort") == 0) aborted = 1;
    pagellm_output_free(o);
  }
  CHECK(aborted);
  CHECK(pagellm_abort(e, "never-added") == PAGELLM_OK);
  CHECK(pagellm_num_unfinished(e) == 0);
}

static void test_samples_and_logprobs(pagellm_engine* e) {
  CHECK(pagellm_add_request(e, "n2", "Once upon", NULL, 0,
                            "{\"n\": 2, \"seed\": 7, \"max_tokens\": 8, \"ignore_eos\": true, \"logprobs\": 2}") ==
        PAGELLM_OK);
  int seen[2] = {0, 0}, finished = 0, logprobs_ok = 1;
  while (!finished) {
    pagellm_output* o = NULL;
    if (pagellm_next_output(e, 10000, &o) != PAGELLM_OK) {
      CHECK(0);
      break;
    }
    for (size_t i = 0; i < pagellm_output_num_completions(o); ++i) {
      const int32_t index = pagellm_output_index(o, i);
      CHECK(index == 0 || index == 1);
      size_t n = 0, m = 0;
      pagellm_output_token_ids(o, i, &n);
      const float* lp = pagellm_output_logprobs(o, i, &m);
      if (index == 0 || index == 1) seen[index] += (int)n;
      if (m != n) logprobs_ok = 0;
      for (size_t k = 0; k < m; ++k)
        if (!(lp[k] <= 0.0f)) logprobs_ok = 0;
    }
    finished = pagellm_output_finished(o);
    pagellm_output_free(o);
  }
  CHECK(seen[0] == 8 && seen[1] == 8);
  CHECK(logprobs_ok);
}

static void test_bad_requests(pagellm_engine* e) {
  int32_t bad_ids[2] = {1, 1 << 30};
  CHECK(pagellm_add_request(e, "bad", "x", NULL, 0, "{\"temperature\": -1}") == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(strstr(pagellm_last_error(), "temperature") != NULL);
  CHECK(pagellm_add_request(e, "bad", "x", NULL, 0, "[1, 2]") == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(pagellm_add_request(e, "bad", "x", NULL, 0, "{\"max_tokens\": \"many\"") == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(pagellm_add_request(e, "bad", NULL, bad_ids, 2, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(pagellm_add_request(e, "bad", NULL, NULL, 3, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(pagellm_add_request(e, "", "x", NULL, 0, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(pagellm_add_request(NULL, "x", "x", NULL, 0, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
  /* A prompt longer than the context (max_model_len 256). */
  static char long_prompt[8192];
  for (size_t i = 0; i + 6 < sizeof long_prompt; i += 6) memcpy(long_prompt + i, "word. ", 6);
  long_prompt[sizeof long_prompt - 1] = '\0';
  CHECK(pagellm_generate(e, long_prompt, NULL, 0, NULL, NULL, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(pagellm_num_unfinished(e) == 0);
}

/* pagellm.h's strings are UTF-8: anything else is an invalid argument naming
 * the parameter, and nothing is queued. */
static void test_invalid_utf8(pagellm_engine* e) {
  static const char* const bad[] = {
      "abc\xff",            /* a byte that never starts a character */
      "abc\xc3",            /* a character cut short */
      "\xc0\xaf",           /* an overlong '/' */
      "x\xed\xa0\x80y",     /* a surrogate (U+D800) */
      "\xf4\x90\x80\x80",  /* above U+10FFFF */
  };
  int32_t ids[8];
  size_t n = 0;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    CHECK(pagellm_add_request(e, "utf8", bad[i], NULL, 0, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(pagellm_last_error(), "'prompt' is not valid UTF-8") != NULL);
    CHECK(pagellm_generate(e, bad[i], NULL, 0, NULL, NULL, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(pagellm_last_error(), "'prompt' is not valid UTF-8") != NULL);
    CHECK(pagellm_add_request(e, bad[i], "Once", NULL, 0, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(pagellm_last_error(), "'request_id' is not valid UTF-8") != NULL);
    CHECK(pagellm_abort(e, bad[i]) == PAGELLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(pagellm_last_error(), "'request_id' is not valid UTF-8") != NULL);
    CHECK(pagellm_tokenize(e, bad[i], 1, ids, 8, &n) == PAGELLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(pagellm_last_error(), "'text' is not valid UTF-8") != NULL);
  }
  /* The message gives the offset of the first bad byte. */
  CHECK(pagellm_add_request(e, "utf8", "abc\xff", NULL, 0, NULL) == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(strstr(pagellm_last_error(), "0xFF at offset 3") != NULL);
  /* JSON arguments: the JSON parser refuses such strings. */
  CHECK(pagellm_add_request(e, "utf8", "Once", NULL, 0, "{\"stop\": [\"\xff\"]}") == PAGELLM_ERR_INVALID_ARGUMENT);
  CHECK(strstr(pagellm_last_error(), "sampling_json") != NULL);
  CHECK(pagellm_num_unfinished(e) == 0);
  /* Valid multi-byte text and ids still go through. */
  int32_t room[64];
  CHECK(pagellm_tokenize(e, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82", 1, room, 64, &n) == PAGELLM_OK);
  CHECK(pagellm_add_request(e, "caf\xc3\xa9", "\xe2\x82\xac", NULL, 0, "{\"max_tokens\": 2}") == PAGELLM_OK);
  int finished = 0;
  while (!finished) {
    pagellm_output* o = NULL;
    if (pagellm_next_output(e, 10000, &o) != PAGELLM_OK) {
      CHECK(0);
      break;
    }
    CHECK(strcmp(pagellm_output_request_id(o), "caf\xc3\xa9") == 0);
    finished = pagellm_output_finished(o);
    pagellm_output_free(o);
  }
}

/* Threads generating at once share the engine's batches; greedy output is the
 * same as alone. */
typedef struct {
  pagellm_engine* engine;
  collected result;
  pagellm_status status;
} worker;

static void* run_worker(void* arg) {
  worker* w = (worker*)arg;
  w->status = pagellm_generate(w->engine, "Once upon a time", NULL, 0, GREEDY, on_output, &w->result);
  return NULL;
}

static void test_threads(pagellm_engine* e) {
  collected alone;
  memset(&alone, 0, sizeof alone);
  CHECK(pagellm_generate(e, "Once upon a time", NULL, 0, GREEDY, on_output, &alone) == PAGELLM_OK);
  enum { kThreads = 4 };
  worker workers[kThreads];
  pthread_t threads[kThreads];
  for (int i = 0; i < kThreads; ++i) {
    memset(&workers[i], 0, sizeof workers[i]);
    workers[i].engine = e;
    CHECK(pthread_create(&threads[i], NULL, run_worker, &workers[i]) == 0);
  }
  for (int i = 0; i < kThreads; ++i) {
    pthread_join(threads[i], NULL);
    CHECK(workers[i].status == PAGELLM_OK);
    CHECK(workers[i].result.num_tokens == alone.num_tokens);
    CHECK(strcmp(workers[i].result.text, alone.text) == 0);
  }
}

/* A backend plugin loaded by libpagellm.so (the plain C ABI needs no symbol of
 * the executable's): its greedy text is the CPU's with float matmuls. */
static void test_backend_plugin(const char* model, const char* plugin) {
  char options[1024];
  pagellm_engine *dev = NULL, *cpu = NULL;
  collected on_dev, on_cpu;
  memset(&on_dev, 0, sizeof on_dev);
  memset(&on_cpu, 0, sizeof on_cpu);
  snprintf(options, sizeof options,
           "{\"max_model_len\": 128, \"device\": \"cscalar\", \"backend_plugin\": [\"%s\"], \"seed\": 1}", plugin);
  CHECK(pagellm_engine_create(model, options, &dev) == PAGELLM_OK);
  CHECK(pagellm_engine_create(model, "{\"max_model_len\": 128, \"exact_matmul\": true, \"num_threads\": 1}", &cpu) ==
        PAGELLM_OK);
  if (!dev || !cpu) {
    if (dev) pagellm_engine_destroy(dev);
    if (cpu) pagellm_engine_destroy(cpu);
    return;
  }
  CHECK(pagellm_generate(dev, "Once upon a time", NULL, 0, GREEDY, on_output, &on_dev) == PAGELLM_OK);
  CHECK(pagellm_generate(cpu, "Once upon a time", NULL, 0, GREEDY, on_output, &on_cpu) == PAGELLM_OK);
  CHECK(on_dev.num_tokens == 24);
  CHECK(on_dev.num_tokens == on_cpu.num_tokens);
  CHECK(memcmp(on_dev.tokens, on_cpu.tokens, on_cpu.num_tokens * sizeof(int32_t)) == 0);
  pagellm_engine_destroy(dev);
  pagellm_engine_destroy(cpu);
  /* A device nobody serves is an error, not a crash. */
  dev = NULL;
  CHECK(pagellm_engine_create(model, "{\"device\": \"cscalar:2\"}", &dev) != PAGELLM_OK);
  CHECK(strstr(pagellm_last_error(), "one device, not 2") != NULL);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  FILE* f = fopen(argv[1], "rb");
  if (!f) {
    fprintf(stderr, "skipped: missing test data %s\n", argv[1]);
    return 77;
  }
  fclose(f);
  test_errors_without_engine(argv[1]);

  pagellm_engine* e = NULL;
  CHECK(pagellm_engine_create(argv[1], "{\"max_model_len\": 256, \"num_threads\": 1, \"seed\": 1}", &e) ==
        PAGELLM_OK);
  if (!e) return 1;
  CHECK(pagellm_engine_max_model_len(e) == 256);
  CHECK(pagellm_engine_vocab_size(e) > 0);
  test_tokenizer(e);
  test_generate_and_poll(e);
  test_abort(e);
  test_samples_and_logprobs(e);
  test_bad_requests(e);
  test_invalid_utf8(e);
  test_threads(e);
  pagellm_engine_destroy(e);
  if (argc > 2) test_backend_plugin(argv[1], argv[2]);

  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("all C API checks passed\n");
  return 0;
}
