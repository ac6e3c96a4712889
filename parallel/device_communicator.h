// The communicator FSDP uses for collectives over a backend's memory.
//
// The CPU backend's buffers are host memory: the world communicator (MPI, or the single-process
// one) moves them directly. A GPU's buffers need the GPU's own library: the CUDA build registers
// a factory (backend/cuda/nccl_communicator.cu) that bootstraps an NcclCommunicator over the
// host world (ncclUniqueId broadcast over MPI) and orders its collectives after the work the
// backend has queued. The trainer keeps the host world for its own scalars, barriers and
// checkpoint coordination.
#pragma once
#include <memory>

#include "backend/backend.h"
#include "parallel/communicator.h"

namespace mx {

// Null when `host` itself serves the backend (host-addressable memory, or one process).
// Collective over `host` when it returns non-null. UserError for a backend that needs a device
// communicator this program has not got.
std::unique_ptr<Communicator> make_device_communicator(Communicator& host, Backend& backend);

using DeviceCommunicatorFactory = std::unique_ptr<Communicator> (*)(Communicator& host,
                                                                    Backend& backend);
void register_device_communicator_factory(DeviceCommunicatorFactory factory);

}  // namespace mx
