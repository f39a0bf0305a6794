// NCCL under the ring driver: communicator bootstrap from a unique id and grouped send/recv.
#include <nccl.h>

#include <cstring>
#include <string>

#include "core/errors.h"
#include "nccl/transport.h"

namespace ringzero::nccl {
namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw CommError(std::string("ringzero NCCL: ") + what + ": " + ncclGetErrorString(r));
}

}  // namespace

std::string NcclTransport::make_unique_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

NcclTransport::NcclTransport(const std::string& unique_id, int rank, int nranks) : rank_(rank) {
  if (unique_id.size() != sizeof(ncclUniqueId))
    throw InvalidArgument("ringzero NCCL: unique id must be " + std::to_string(sizeof(ncclUniqueId)) + " bytes");
  if (rank < 0 || rank >= nranks) throw InvalidArgument("ringzero NCCL: rank out of range");
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclComm_t comm;
  check(ncclCommInitRank(&comm, nranks, id, rank), "ncclCommInitRank");
  comm_ = comm;
}

NcclTransport::~NcclTransport() {
  if (comm_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
}

void NcclTransport::group_start() { check(ncclGroupStart(), "ncclGroupStart"); }

void NcclTransport::send(int rank, const void* buf, size_t bytes, int peer, cudaStream_t stream) {
  if (rank != rank_) throw InvalidArgument("ringzero NCCL: a process posts only its own rank's sends");
  check(ncclSend(buf, bytes, ncclUint8, peer, static_cast<ncclComm_t>(comm_), stream), "ncclSend");
}

void NcclTransport::recv(int rank, void* buf, size_t bytes, int peer, cudaStream_t stream) {
  if (rank != rank_) throw InvalidArgument("ringzero NCCL: a process posts only its own rank's receives");
  check(ncclRecv(buf, bytes, ncclUint8, peer, static_cast<ncclComm_t>(comm_), stream), "ncclRecv");
}

void NcclTransport::group_end() { check(ncclGroupEnd(), "ncclGroupEnd"); }

}  // namespace ringzero::nccl
