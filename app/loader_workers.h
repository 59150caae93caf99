#pragma once
// How many loader threads a rank starts when data.workers = -1.

namespace trainer {

// Cores are shared by the ranks of this node (LOCAL_WORLD_SIZE); each rank's loader gets its share
// of them, at least one.
int default_loader_workers();

}  // namespace trainer
