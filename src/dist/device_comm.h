// Collectives on device buffers for tensor and pipeline parallelism
// (backend/backend.h, DeviceComm). A backend that brings its own (NCCL,
// HCCL, BKCL style) gets it initialized here: rank 0 makes the unique id,
// the host communicator hands it to every rank. Any other backend gets the
// host default: each collective copies the device buffer to the host, runs
// the host communicator's collective (MPI), and copies the result back.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "dist/communicator.h"

namespace pagellm::dist {

// The group of `host`'s ranks on `backend`'s buffers. Collective: every rank
// of `host` calls it. `host` must outlive the result.
std::unique_ptr<DeviceComm> make_device_comm(Backend& backend, Communicator& host);

// The host default only (tests compare it with a backend's own).
std::unique_ptr<DeviceComm> make_host_device_comm(Backend& backend, Communicator& host);

}  // namespace pagellm::dist
