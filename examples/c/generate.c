/* Streams one completion through the C API.
 * Build: cc generate.c $(pkg-config --cflags --libs pagellm) -o generate
 * Run:   ./generate MODEL.gguf "Once upon a time" */
#include <stdio.h>

#include <pagellm.h>

static int print_delta(const pagellm_output* out, void* user) {
  (void)user;
  size_t len = 0;
  const char* text = pagellm_output_text(out, 0, &len);
  fwrite(text, 1, len, stdout);
  fflush(stdout);
  return 0; /* non-zero would abort the request */
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL PROMPT\n", argv[0]);
    return 2;
  }
  pagellm_engine* engine = NULL;
  if (pagellm_engine_create(argv[1], "{\"max_model_len\": 512}", &engine) != PAGELLM_OK) {
    fprintf(stderr, "error: %s\n", pagellm_last_error());
    return 1;
  }
  pagellm_status s = pagellm_generate(engine, argv[2], NULL, 0, "{\"temperature\": 0, \"max_tokens\": 32}",
                                      print_delta, NULL);
  printf("\n");
  if (s != PAGELLM_OK) fprintf(stderr, "error: %s\n", pagellm_last_error());
  pagellm_engine_destroy(engine);
  return s == PAGELLM_OK ? 0 : 1;
}
