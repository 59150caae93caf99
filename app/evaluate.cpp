#include "app/evaluate.h"

#include "app/train_loop.h"

#include "data/distributed_sampler.h"
#include "dist/comm.h"
#include "data/loader.h"
#include "data/normalize.h"
#include "nn/functional.h"

namespace trainer {

EvalMetrics evaluate(Experiment& e, const Dataset& dataset, Comm* comm) {
  const Config& c = e.config;
  EvalShard shard(dataset.size(), e.world_size, e.rank);
  LoaderOptions lo;
  lo.batch_size = c.data.eval_batch_size;
  lo.drop_last = false;  // every sample exactly once
  lo.num_workers = c.data.workers < 0 ? default_loader_workers() : c.data.workers;
  lo.queue_depth = c.data.prefetch_batches;
  std::shared_ptr<const Dataset> ds(std::shared_ptr<const Dataset>{}, &dataset);  // non-owning
  DataLoader loader(ds, shard.indices(), lo);

  const bool was_training = e.model->is_training();
  e.model->eval();
  NoGradGuard no_grad;
  EvalMetrics metrics(dataset.num_classes());
  while (auto batch = loader.next()) {
    Tensor x = to_float_normalized(batch->images, e.normalization.mean, e.normalization.std).to(e.device);
    const Tensor labels = batch->labels.to(e.device);
    Variable logits = (*e.model)(Variable(x));
    auto [loss, probs] = backend_for(logits.data()).cross_entropy(logits.data(), labels, 0.0);
    metrics.add_batch(logits.data(), labels, loss);
  }
  e.model->train(was_training);
  if (comm && comm->world_size() > 1) {
    Tensor sums = Tensor::from_vector(metrics.sums(), {static_cast<int64_t>(metrics.sums().size())});
    comm->all_reduce(sums, ReduceOp::sum);
    return EvalMetrics::from_sums(dataset.num_classes(), sums.to_vector<double>());
  }
  return metrics;
}

}  // namespace trainer
