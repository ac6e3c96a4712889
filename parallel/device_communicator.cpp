#include "parallel/device_communicator.h"

#include "core/error.h"

namespace mx {

namespace {
DeviceCommunicatorFactory g_factory = nullptr;
}  // namespace

void register_device_communicator_factory(DeviceCommunicatorFactory factory) {
  g_factory = factory;
}

std::unique_ptr<Communicator> make_device_communicator(Communicator& host, Backend& backend) {
  // One process moves nothing between ranks; host memory (CPU, and the CPU's staging test
  // mode) travels over the host world.
  // (The CPU backend's MemoryResource under MXTRAIN_TEST_DEVICE_MEMORY is host memory too.)
  if (host.size() == 1 || !backend.memory() || backend.name() == "cpu") return nullptr;
  if (!g_factory)
    throw UserError(str("the ", backend.name(), " backend has no communicator in this build: ",
                        "run one process, or run.device = cpu"));
  return g_factory(host, backend);
}

}  // namespace mx
