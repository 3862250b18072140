// A C++17 consumer of pdx, built by scripts/test-install.sh through
// find_package(pdx) against an installed prefix and through
// add_subdirectory(pdx): two native TCP engines on 127.0.0.1, a write into
// the other's registered buffer and a read back. Exits non-zero on error.
#include <pdx.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

void check(pdx_status s, std::string_view what) {
  if (s != PDX_OK) {
    throw std::runtime_error(std::string(what) + ": " + pdx_status_str(s) + ": " + pdx_last_error_message());
  }
}

struct EngineFree {
  void operator()(pdx_engine *e) const noexcept { pdx_engine_free(e); }
};
using Engine = std::unique_ptr<pdx_engine, EngineFree>;

Engine start() {
  pdx_engine *e = nullptr;
  check(pdx_engine_init("127.0.0.1", "tcp", nullptr, &e), "pdx_engine_init");
  return Engine(e);
}

}  // namespace

int main(int argc, char **argv) try {
  const std::string_view name = argc > 1 ? argv[1] : "c++ consumer";
  constexpr std::size_t len = 1 << 20;
  std::vector<std::uint8_t> pool(len), src(len), back(len);
  for (std::size_t i = 0; i < len; i++) src[i] = static_cast<std::uint8_t>(i * 131u + 7u);

  Engine target = start(), initiator = start();
  check(pdx_register_memory(target.get(), pool.data(), pool.size()), "pdx_register_memory");
  const std::string session = pdx_engine_session_id(target.get());
  const auto remote = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(pool.data()));
  check(pdx_transfer_sync_write(initiator.get(), session.c_str(), src.data(), remote, len), "write");
  check(pdx_transfer_sync_read(initiator.get(), session.c_str(), back.data(), remote, len), "read");
  if (pool != src || back != src) throw std::runtime_error("bytes differ after the round trip");
  std::printf("%.*s: %s, wrote and read back %zu bytes through %s\n", static_cast<int>(name.size()), name.data(),
              pdx_version(), len, session.c_str());
  return 0;
} catch (const std::exception &e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
