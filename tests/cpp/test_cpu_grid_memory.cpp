// Device memory and IPC on the CPU grid against what a GPU allows (CPU grid only; [Note: device memory
// on the CPU grid] in csrc/cuda/cpu_grid/grid.h): the IPC rules between processes (no opening one's own
// handle, one open mapping per process, a handle of freed memory does not open, only an open mapping
// closes, a peer's mapping outlives the owner's cudaFree), and, each in a child process of its own, the
// faults: the host reading or writing device memory (its own or an IPC mapping) after a
// synchronisation, and device work using a closed IPC mapping. A child must exit with the grid's status
// 86 and name what it touched; controls (the host touching cudaHostAlloc'd memory, device work on
// device memory right after a synchronisation) must exit 0.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "cuda_test_util.h"

using namespace ringzero::test;
using ringzero::cpu_grid::set_process;

namespace {

constexpr size_t kBytes = 10000;  // not a whole number of pages: the mapping is rounded up

// Device memory's bytes, read the way the host may: a cudaMemcpy (device work) after a sync.
std::vector<unsigned char> read_back(const void* p, size_t n) {
  std::vector<unsigned char> h(n);
  CUDA_OK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
  return h;
}
bool all_equal(const std::vector<unsigned char>& v, unsigned char b) {
  for (unsigned char c : v)
    if (c != b) return false;
  return true;
}

cudaIpcMemHandle_t handle_of(void* p) {
  cudaIpcMemHandle_t h;
  CUDA_OK(cudaIpcGetMemHandle(&h, p));
  return h;
}

void ipc_rules() {
  set_process(1);
  void* a = nullptr;
  CUDA_OK(cudaMalloc(&a, kBytes));
  CUDA_OK(cudaMemset(a, 0x11, kBytes));
  cudaIpcMemHandle_t h;
  CHECK(cudaIpcGetMemHandle(&h, static_cast<char*>(a) + 256) == cudaErrorInvalidValue,
        "a handle of a pointer inside an allocation (not its base) was given");
  h = handle_of(a);
  void* p = nullptr;
  CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) == cudaErrorDeviceUninitialized,
        "the allocating process opened its own handle");

  set_process(2);
  void* p2 = nullptr;
  CUDA_OK(cudaIpcOpenMemHandle(&p2, h, cudaIpcMemLazyEnablePeerAccess));
#if !defined(__SANITIZE_THREAD__)
  CHECK(p2 != a, "another process's mapping has the owner's address (the grid maps handles elsewhere)");
#endif
  void* again = nullptr;
  CHECK(cudaIpcOpenMemHandle(&again, h, cudaIpcMemLazyEnablePeerAccess) == cudaErrorAlreadyMapped,
        "a process opened the same handle twice");
  CHECK(all_equal(read_back(p2, kBytes), 0x11), "the peer's mapping does not show the owner's bytes");
  CUDA_OK(cudaMemset(p2, 0x5a, kBytes));  // written through the peer's mapping
  CHECK(all_equal(read_back(a, kBytes), 0x5a), "the owner does not see what the peer wrote");

  set_process(3);
  void* p3 = nullptr;
  CUDA_OK(cudaIpcOpenMemHandle(&p3, h, cudaIpcMemLazyEnablePeerAccess));
#if !defined(__SANITIZE_THREAD__)  // under TSan every mapping is the owner's address, so p2 is p3 too
  CHECK(cudaIpcCloseMemHandle(p2) == cudaErrorInvalidValue, "a process closed another process's mapping");
#endif

  set_process(2);
  CUDA_OK(cudaIpcCloseMemHandle(p2));
  CHECK(cudaIpcCloseMemHandle(p2) == cudaErrorInvalidValue, "a mapping closed twice");
  CUDA_OK(cudaIpcOpenMemHandle(&p2, h, cudaIpcMemLazyEnablePeerAccess));  // open again after a close

  set_process(1);
  CHECK(cudaFree(static_cast<char*>(a) + 256) == cudaErrorInvalidValue, "cudaFree of a pointer inside an allocation");
  CUDA_OK(cudaFree(a));  // the peers' mappings hold the pages on
  CHECK(cudaFree(a) == cudaErrorInvalidValue, "an allocation freed twice");

  set_process(3);
  CHECK(all_equal(read_back(p3, kBytes), 0x5a), "a peer's mapping lost its bytes when the owner freed it");
  set_process(4);
  CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) == cudaErrorMapBufferObjectFailed,
        "a handle of freed memory opened");
  set_process(3);
  CUDA_OK(cudaIpcCloseMemHandle(p3));
  set_process(2);
  CUDA_OK(cudaIpcCloseMemHandle(p2));
  set_process(0);
  CUDA_OK(cudaFree(nullptr));
  cudaGetLastError();  // the refusals above recorded errors
}

#if defined(__SANITIZE_THREAD__)
constexpr const char* kIpcSays = "host code touched device memory";  // the mapping is the owner's there
#else
constexpr const char* kIpcSays = "(an IPC mapping of";
#endif

// Each death case: what a child does; the parent expects status 86 and `says` in its output.
struct Death {
  const char* name;
  const char* says;  // null: a control, must exit 0
  void (*run)();
};

void* synced_device_memory() {
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, kBytes));
  CUDA_OK(cudaMemset(p, 0x22, kBytes));
  CUDA_OK(cudaDeviceSynchronize());
  return p;
}

const Death kDeaths[] = {
    {"host-reads-device-memory", "host code touched device memory",
     [] {
       auto* p = static_cast<volatile unsigned char*>(synced_device_memory());
       std::printf("read %d\n", p[kBytes - 1]);
     }},
    {"host-writes-device-memory", "host code touched device memory",
     [] { static_cast<volatile unsigned char*>(synced_device_memory())[0] = 1; }},
    {"host-reads-an-ipc-mapping", kIpcSays,
     [] {
       set_process(1);
       void* a = synced_device_memory();
       set_process(2);
       void* p = nullptr;
       CUDA_OK(cudaIpcOpenMemHandle(&p, handle_of(a), cudaIpcMemLazyEnablePeerAccess));
       CUDA_OK(cudaDeviceSynchronize());
       std::printf("read %d\n", static_cast<volatile unsigned char*>(p)[0]);
     }},
#if !defined(__SANITIZE_THREAD__)
    {"device-work-uses-a-closed-mapping", "cudaIpcCloseMemHandle closed",
     [] {
       set_process(1);
       void* a = synced_device_memory();
       set_process(2);
       void* p = nullptr;
       CUDA_OK(cudaIpcOpenMemHandle(&p, handle_of(a), cudaIpcMemLazyEnablePeerAccess));
       CUDA_OK(cudaIpcCloseMemHandle(p));
       read_back(p, 16);  // a device-to-host copy through the closed mapping: device work faults
     }},
#endif
    {"control-host-memory", nullptr,
     [] {
       void* h = nullptr;
       CUDA_OK(cudaHostAlloc(&h, kBytes, cudaHostAllocMapped));
       void* d = synced_device_memory();
       CUDA_OK(cudaMemcpy(h, d, kBytes, cudaMemcpyDeviceToHost));
       CHECK(all_equal(std::vector<unsigned char>(static_cast<unsigned char*>(h), static_cast<unsigned char*>(h) + kBytes), 0x22),
             "cudaHostAlloc'd memory not readable by the host");
       CUDA_OK(cudaMemset(d, 0x33, kBytes));  // device work on closed device memory opens it
       CHECK(all_equal(read_back(d, kBytes), 0x33), "device work after a synchronisation did not run");
       CUDA_OK(cudaFreeHost(h));
       CUDA_OK(cudaFree(d));
     }},
};

// Runs the named case in a child (this program again) and checks how it ended.
void check_death(const Death& d) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  CHECK(n > 0, "readlink /proc/self/exe failed");
  if (n <= 0) return;
  exe[n] = 0;
  const std::string cmd = std::string("'") + exe + "' " + d.name + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  CHECK(f != nullptr, "could not start %s", cmd.c_str());
  if (!f) return;
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, got);
  const int status = pclose(f);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (d.says) {
    CHECK(code == 86 && out.find(d.says) != std::string::npos, "%s: exit %d (want 86 naming \"%s\"), output:\n%s",
          d.name, code, d.says, out.c_str());
  } else {
    CHECK(code == 0, "%s (a control): exit %d, output:\n%s", d.name, code, out.c_str());
  }
  std::printf("%-36s exit %d%s\n", d.name, code, d.says ? " (the grid named it)" : " (control)");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2) {  // a child: run one case
    for (const Death& d : kDeaths)
      if (std::strcmp(argv[1], d.name) == 0) {
        d.run();
        CUDA_OK(cudaDeviceSynchronize());
        return finish();
      }
    std::fprintf(stderr, "no case %s\n", argv[1]);
    return 2;
  }
  ipc_rules();
  for (const Death& d : kDeaths) check_death(d);
#if defined(__SANITIZE_THREAD__)
  std::printf("not run under ThreadSanitizer: device-work-uses-a-closed-mapping (the mapping is the owner's there)\n");
#endif
  return finish();
}
