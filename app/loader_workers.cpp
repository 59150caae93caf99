#include "app/loader_workers.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace trainer {

int default_loader_workers() {
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  const unsigned ranks = std::max(1, local_world ? std::atoi(local_world) : 1);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::max(1u, cores / ranks / 2));  // the other half is the math library's
}

}  // namespace trainer
