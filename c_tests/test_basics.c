/* Version, status texts and the last-error contract. */
#include "harness.h"

int main(void) {
  char expected[64];
  snprintf(expected, sizeof expected, "pdx/%d.%d.%d", PDX_VERSION_MAJOR, PDX_VERSION_MINOR,
           PDX_VERSION_PATCH);
  CHECK_STR(pdx_version(), expected);
  CHECK(PDX_VERSION_NUMBER ==
        ((PDX_VERSION_MAJOR << 16) | (PDX_VERSION_MINOR << 8) | PDX_VERSION_PATCH));

  CHECK_STR(pdx_status_str(PDX_OK), "ok");
  CHECK_STR(pdx_status_str(PDX_ERR_TIMEOUT), "deadline exceeded");
  CHECK_STR(pdx_status_str(-9999), "unknown status code");
  CHECK_STR(pdx_status_str(2147483647), "unknown status code");
  for (int code = -100; code <= 0; code++) CHECK(pdx_status_str(code) != NULL);

  /* Nothing failed yet on this thread: empty, never NULL. */
  CHECK(pdx_last_error_message() != NULL);
  CHECK_STR(pdx_last_error_message(), "");
  return pdx_test_finish("test_basics");
}
