#include <moelite.h>
#include <stdio.h>

int main(void) {
  if (moelite_version_number() != MOELITE_VERSION_NUMBER) return 1;
  moelite_model* m = NULL;
  if (moelite_model_load("/nonexistent.gguf", NULL, &m) != MOELITE_ERR_FILE_NOT_FOUND) return 1;
  printf("moelite %s\n", moelite_version_string());
  return 0;
}
