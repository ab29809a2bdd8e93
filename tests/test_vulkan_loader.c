/* The Vulkan loader is dlopen()ed at run time; MOELITE_VULKAN_LOADER names the file to open.
 *   test_vulkan_loader MODEL.gguf missing   (MOELITE_VULKAN_LOADER names a file that is not there)
 *     MOELITE_BACKEND_AUTO loads and evaluates on the CPU; MOELITE_BACKEND_VULKAN fails with
 *     MOELITE_ERR_BACKEND_UNAVAILABLE and a message naming the file and why it could not be opened.
 *   test_vulkan_loader MODEL.gguf present   (MOELITE_VULKAN_LOADER names the real loader)
 *     MOELITE_BACKEND_VULKAN loads and evaluates; exit 77 (skip) where the loader opens but no
 *     Vulkan device exists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moelite.h"

static moelite_status load(const char* path, moelite_backend backend, moelite_model** out) {
  moelite_model_params* p = moelite_model_params_create();
  if (!p) return MOELITE_ERR_OUT_OF_MEMORY;
  moelite_status st = moelite_model_params_set_backend(p, backend);
  if (st == MOELITE_OK) st = moelite_model_load(path, p, out);
  moelite_model_params_free(p);
  return st;
}

/* Evaluates two tokens; 0 on success. */
static int evaluate(moelite_model* model) {
  moelite_context* ctx = NULL;
  int32_t tokens[2] = {1, 2};
  int rc = moelite_context_create(model, NULL, &ctx) == MOELITE_OK && moelite_eval(ctx, tokens, 2, 0) == MOELITE_OK &&
                   moelite_get_logits(ctx, -1) != NULL
               ? 0
               : 1;
  if (rc) fprintf(stderr, "evaluation failed: %s\n", moelite_last_error());
  moelite_context_free(ctx);
  return rc;
}

int main(int argc, char** argv) {
  const char* loader = getenv("MOELITE_VULKAN_LOADER");
  if (argc < 3 || !loader) {
    fprintf(stderr, "usage: MOELITE_VULKAN_LOADER=FILE %s MODEL.gguf missing|present\n", argv[0]);
    return 2;
  }
  moelite_model* model = NULL;
  moelite_status st;
  if (strcmp(argv[2], "missing") == 0) {
    st = load(argv[1], MOELITE_BACKEND_AUTO, &model);
    if (st != MOELITE_OK) {
      fprintf(stderr, "FAIL: AUTO without a Vulkan loader: %s: %s\n", moelite_status_name(st), moelite_last_error());
      return 1;
    }
    printf("auto: %s\n", moelite_model_backend_name(model));
    if (strncmp(moelite_model_backend_name(model), "cpu", 3) != 0 || evaluate(model)) {
      fprintf(stderr, "FAIL: AUTO did not evaluate on the CPU\n");
      return 1;
    }
    moelite_model_free(model);
    model = NULL;
    st = load(argv[1], MOELITE_BACKEND_VULKAN, &model);
    printf("vulkan: %s: %s\n", moelite_status_name(st), moelite_last_error());
    if (st != MOELITE_ERR_BACKEND_UNAVAILABLE || model != NULL || !strstr(moelite_last_error(), loader)) {
      fprintf(stderr, "FAIL: expected MOELITE_ERR_BACKEND_UNAVAILABLE naming %s\n", loader);
      return 1;
    }
    return 0;
  }
  st = load(argv[1], MOELITE_BACKEND_VULKAN, &model);
  if (st == MOELITE_ERR_BACKEND_UNAVAILABLE && !strstr(moelite_last_error(), "loader")) {
    printf("skipped: %s\n", moelite_last_error());
    return 77;
  }
  if (st != MOELITE_OK) {
    fprintf(stderr, "FAIL: VULKAN with %s: %s: %s\n", loader, moelite_status_name(st), moelite_last_error());
    return 1;
  }
  printf("vulkan: %s\n", moelite_model_backend_name(model));
  int rc = evaluate(model);
  moelite_model_free(model);
  return rc;
}
