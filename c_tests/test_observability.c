/* Capabilities, and engine statistics against a known workload: two native engines on
 * loopback, a fixed set of writes, reads, a refused request and a batch with
 * zero-length entries; every counter of both engines checked exactly (the
 * handshake and connection counts, which depend on reconnects, by bounds),
 * plus the versioned struct: a shorter caller size fills only that prefix; the same
 * workload in the metrics text and the peer's figures (issue 23). */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pdx_stats stats_of(pdx_engine *e) {
  pdx_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  CHECK_OK(pdx_engine_stats(e, &s));
  CHECK(s.size == sizeof s);
  return s;
}

int main(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  pdx_engine *a = start_engine();
  pdx_engine *b = start_engine();
  const char *peer = pdx_engine_session_id(b);
  static unsigned char src[1 << 16], dst[1 << 16];
  CHECK_OK(pdx_register_memory(b, dst, sizeof dst));
  /* Registered on the initiator too: the same-host link copies only that. */
  CHECK_OK(pdx_register_memory(a, src, sizeof src));
  uint64_t remote = (uint64_t)(uintptr_t)dst;

  pdx_stats zero = stats_of(a);
  CHECK(zero.tasks_written == 0 && zero.bytes_written == 0 && zero.tasks_failed == 0);
  CHECK(zero.latency_p50_us == 0 && zero.latency_p99_us == 0);

  /* 1 + 3 writes (one of them empty), 2 reads, 1 refused write. */
  CHECK_OK(pdx_transfer_sync_write(a, peer, src, remote, 4096));
  void *locals[3] = {src, src + 100, src};
  uint64_t remotes[3] = {remote + 8192, remote + 20000, remote};
  size_t lens[3] = {1000, 30000, 0};
  CHECK_OK(pdx_batch_transfer_sync_write(a, peer, locals, remotes, lens, 3));
  CHECK_OK(pdx_transfer_sync_read(a, peer, src, remote, 512));
  CHECK_OK(pdx_transfer_sync_read(a, peer, src, remote + 512, 1));
  CHECK_STATUS(pdx_transfer_sync_write(a, peer, src, remote + sizeof dst, 16), PDX_ERR_REMOTE_REJECTED);

  pdx_stats sa = stats_of(a), sb = stats_of(b);
  CHECK(sa.tasks_written == 4);
  CHECK(sa.bytes_written == 4096 + 1000 + 30000);
  CHECK(sa.tasks_read == 2);
  CHECK(sa.bytes_read == 513);
  CHECK(sa.tasks_failed == 1);
  CHECK(sa.failed_remote_rejected == 1);
  CHECK(sa.failed_timeout + sa.failed_connection_lost + sa.failed_peer_unreachable + sa.failed_shutdown +
            sa.failed_protocol + sa.failed_other == 0);
  CHECK(sa.peers_connected == 1);
  CHECK(sa.served_writes == 0 && sa.served_reads == 0 && sa.handshakes == 0);
  CHECK(sa.latency_p50_us > 0 && sa.latency_p50_us <= sa.latency_p99_us);

  CHECK(sb.served_writes == 3);
  CHECK(sb.served_bytes_written == 4096 + 1000 + 30000);
  CHECK(sb.served_reads == 2);
  CHECK(sb.served_bytes_read == 513);
  CHECK(sb.requests_refused == 1);
  CHECK(sb.handshakes >= 1 && sb.handshakes <= 3);
  CHECK(sb.inbound_connections >= sb.handshakes + 1);
  CHECK(sb.tasks_written == 0 && sb.tasks_read == 0 && sb.peers_connected == 0);

  /* Notifications queued on b count in bytes until drained. */
  CHECK_OK(pdx_send_notify(a, peer, "room", "12345"));
  CHECK(stats_of(b).notification_bytes_queued == 4 + 5);
  pdx_notifications *list = NULL;
  CHECK_OK(pdx_notifications_drain(b, &list));
  pdx_notifications_free(list);
  CHECK(stats_of(b).notification_bytes_queued == 0);

  /* Metrics in the Prometheus text format, and one peer's figures (issue 23):
   * the same workload; the histograms count the refused write too. */
  size_t mlen = 0, mgot = 0;
  CHECK_OK(pdx_engine_metrics(a, NULL, 0, &mlen));
  char *text = malloc(mlen + 4096);
  CHECK_OK(pdx_engine_metrics(a, text, mlen + 4096, &mgot));
  CHECK(mgot >= mlen - 64 && strlen(text) == mgot);
  CHECK(strstr(text, "# TYPE pdx_transferred_bytes_total counter\n") != NULL);
  /* Two engines of one process: every completed byte took the same-host link. */
  CHECK(strstr(text, "pdx_transferred_bytes_total{direction=\"write\",path=\"same-host\"} 35096\n") != NULL);
  CHECK(strstr(text, "pdx_transferred_bytes_total{direction=\"write\",path=\"tcp\"} 0\n") != NULL);
  /* The empty write moved nothing over either path: it counts under tcp. */
  CHECK(strstr(text, "pdx_tasks_completed_total{direction=\"write\",path=\"same-host\"} 3\n") != NULL);
  CHECK(strstr(text, "pdx_tasks_completed_total{direction=\"write\",path=\"tcp\"} 1\n") != NULL);
  CHECK(strstr(text, "pdx_tasks_failed_total{kind=\"remote_rejected\",path=\"tcp\"} 1\n") != NULL);
  CHECK(strstr(text, "pdx_task_size_bytes_count{direction=\"write\",path=\"tcp\"} 5\n") != NULL);
  CHECK(strstr(text, "pdx_task_latency_seconds_count{direction=\"read\",path=\"tcp\"} 2\n") != NULL);
  CHECK(strstr(text, "pdx_peer_") == NULL);
  free(text);
  char info[2048];
  size_t ilen = 0;
  CHECK_OK(pdx_peer_info(a, peer, info, sizeof info, &ilen));
  CHECK(ilen == strlen(info));
  CHECK(strstr(info, "\"path\":\"same-host\"") != NULL && strstr(info, "\"reason\":\"same host") != NULL);
  CHECK(strstr(info, "\"same_host_bytes_written\":35096") != NULL);
  CHECK(strstr(info, "\"bytes_written\":35096") != NULL && strstr(info, "\"tasks_written\":4") != NULL);
  CHECK(strstr(info, "\"remote_rejected\":1") != NULL && strstr(info, "\"last_error\":\"") != NULL);
  CHECK_STATUS(pdx_peer_info(a, "127.0.0.1:1", info, sizeof info, &ilen), PDX_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(pdx_peer_info(a, NULL, info, sizeof info, &ilen), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_engine_metrics(a, NULL, 8, &mlen), PDX_ERR_NULL_ARGUMENT);

  /* An older caller's shorter struct: only its prefix is written. */
  pdx_stats part;
  memset(&part, 0x5a, sizeof part);
  part.size = offsetof(pdx_stats, tasks_read);
  CHECK_OK(pdx_engine_stats(a, &part));
  CHECK(part.size == offsetof(pdx_stats, tasks_read));
  CHECK(part.tasks_written == 4);
  uint64_t untouched;
  memset(&untouched, 0x5a, sizeof untouched);
  CHECK(part.tasks_read == untouched);

  /* Errors: NULL, a size too small, a freed engine; out untouched. */
  CHECK_STATUS(pdx_engine_stats(a, NULL), PDX_ERR_NULL_ARGUMENT);
  pdx_stats bad;
  memset(&bad, 0x5a, sizeof bad);
  bad.size = 4;
  CHECK_STATUS(pdx_engine_stats(a, &bad), PDX_ERR_INVALID_ARGUMENT);
  CHECK(bad.size == 4 && bad.tasks_written == untouched);
  pdx_engine_free(b);
  bad.size = sizeof bad;
  CHECK_STATUS(pdx_engine_stats(b, &bad), PDX_ERR_INVALID_HANDLE);
  CHECK_STATUS(pdx_engine_metrics(b, NULL, 0, &mlen), PDX_ERR_INVALID_HANDLE);
  CHECK(bad.tasks_written == untouched);
  pdx_engine_free(a);

  /* Capabilities: JSON naming both backends and host memory; length query. */
  size_t need = 0;
  CHECK_OK(pdx_capabilities(NULL, 0, &need));
  CHECK(need > 20);
  char *caps = malloc(need + 1);
  size_t got = 0;
  CHECK_OK(pdx_capabilities(caps, need + 1, &got));
  CHECK(got == need && strlen(caps) == need);
  CHECK(strstr(caps, "\"name\":\"tcp\"") != NULL);
  CHECK(strstr(caps, "\"name\":\"mooncake\"") != NULL);
  CHECK(strstr(caps, "\"kind\":\"cpu\"") != NULL);
  free(caps);
  CHECK_STATUS(pdx_capabilities(NULL, 4, NULL), PDX_ERR_NULL_ARGUMENT);
  return pdx_test_finish("test_observability");
}
