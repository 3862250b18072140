/* A Mooncake C API program built against an installed pdx: it includes only
 * <transfer_engine_c.h> and links only -ltransfer_engine (pdx's, from
 * <libdir>/pdx/mooncake), writes 1 MiB from one engine into another and
 * checks the bytes and the notification. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <transfer_engine_c.h>

int main(void) {
  static char src[1 << 20], dst[1 << 20];
  memset(src, 'm', sizeof src);
  transfer_engine_t a = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 0);
  transfer_engine_t b = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 0);
  if (!a || !b || !installTransport(a, "tcp", NULL) || !installTransport(b, "tcp", NULL)) {
    fprintf(stderr, "engines: %s\n", pdx_last_error_message());
    return 1;
  }
  char name[64];
  getLocalIpAndPort(b, name, sizeof name);
  if (registerLocalMemory(a, src, sizeof src, "*", 1) || registerLocalMemory(b, dst, sizeof dst, "*", 1)) return 1;
  int seg = openSegment(a, name);
  uint64_t batch = allocateBatchID(a, 1);
  struct transfer_request r = {OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, sizeof src};
  notify_msg_t m = {(char *)"consumer", (char *)"done"};
  if (seg < 0 || batch == INVALID_BATCH || submitTransferWithNotify(a, batch, &r, 1, m)) {
    fprintf(stderr, "submit: %s\n", pdx_last_error_message());
    return 1;
  }
  transfer_status_t s = {STATUS_WAITING, 0};
  while (s.status == STATUS_WAITING || s.status == STATUS_PENDING)
    if (getTransferStatus(a, batch, 0, &s)) return 1;
  int got = 0, size = 0;
  for (int i = 0; i < 100000 && !got; i++) {
    notify_msg_t *n = getNotifsFromEngine(b, &size);
    got = size == 1 && strcmp(n[0].msg, "done") == 0;
    freeNotifsMsgBuf(n, size);
  }
  int ok = s.status == STATUS_COMPLETED && memcmp(src, dst, sizeof src) == 0 && got && freeBatchID(a, batch) == 0;
  destroyTransferEngine(a);
  destroyTransferEngine(b);
  printf("mooncake C API consumer: %s\n", ok ? "landed, notified" : "FAILED");
  return ok ? 0 : 1;
}
