#include "app/run/evaluate.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "app/run/checkpoint.h"
#include "app/run/device_setup.h"
#include "app/run/loader_workers.h"
#include "data/distributed_sampler.h"
#include "data/loader.h"
#include "data/normalize.h"
#include "dist/comm.h"
#include "nn/amp/autocast.h"
#include "nn/functional.h"
#include "nn/safetensors.h"

namespace trainer {

EvalMetrics evaluate(Experiment& e, const Dataset& dataset, Comm* comm, int64_t* skipped) {
  const Config& c = e.config;
  EvalShard shard(dataset.size(), e.world_size, e.rank);
  LoaderOptions lo;
  lo.batch_size = c.data.eval_batch_size;
  lo.drop_last = false;  // every sample exactly once
  lo.num_workers = c.data.workers < 0 ? default_loader_workers(c, e.local_world_size) : c.data.workers;
  lo.queue_depth = c.data.prefetch_batches;
  std::shared_ptr<const Dataset> ds(std::shared_ptr<const Dataset>{}, &dataset);  // non-owning
  DataLoader loader(ds, shard.indices(), lo);

  const bool was_training = e.model->is_training();
  e.model->eval();
  NoGradGuard no_grad;
  // Per-sample probabilities for ROC-AUC, unless they would take more than 256 MiB (then auc() is NaN).
  const bool keep_scores = dataset.size() * dataset.num_classes() <= (int64_t{1} << 26);
  EvalMetrics metrics(dataset.num_classes(), keep_scores);
  bool outputs_finite = true;
  while (auto batch = loader.next()) {
    Tensor x = to_float_normalized(batch->images, e.normalization.mean, e.normalization.std)
                   .to(e.device)
                   .contiguous(e.precision.input_format);
    const Tensor labels = batch->labels.to(e.device);
    Tensor logits;
    {
      AutocastScope autocast(e.precision.autocast);  // evaluate in the precision the model trains in
      logits = (*e.model)(Variable(x)).data().to(DType::f32);
    }
    // Non-finite outputs (non-finite weights, or fp16 logits that overflowed): no metric is meaningful,
    // and ROC-AUC would refuse the scores. Noted here, agreed by all ranks after the loop.
    if (!backend_for(logits).all_finite(logits)) {
      outputs_finite = false;
      break;
    }
    auto [loss, probs] = backend_for(logits).cross_entropy(logits, labels, 0.0);
    metrics.add_batch(logits, labels, loss, probs);
  }
  e.model->train(was_training);
  // Every rank evaluates its own shard: agree before stopping, so every rank gives the same reason.
  // The same sum counts the images left out on all ranks.
  int64_t any_non_finite = outputs_finite ? 0 : 1;
  int64_t left_out = loader.dropped_samples();
  if (comm && comm->world_size() > 1) {
    Tensor sums = Tensor::from_vector<int64_t>({any_non_finite, left_out}, {2});
    comm->all_reduce(sums, ReduceOp::sum);
    const std::vector<int64_t> totals = sums.to_vector<int64_t>();
    any_non_finite = totals[0];
    left_out = totals[1];
  }
  if (skipped) *skipped = left_out;
  if (any_non_finite)
    throw std::runtime_error(
        "evaluation: the model's outputs are NaN or infinite: training diverged (or, in fp16, the logits "
        "overflowed). HINT: lower optim.lr, add warmup (schedule.warmup_epochs) or clipping "
        "(optim.clip_grad_norm); --resume auto restarts from the last checkpoint");
  // Sums by all-reduce, per-sample scores by an exact all-gather in rank order (= dataset order).
  if (comm && comm->world_size() > 1) return combine_across_ranks(metrics, *comm);
  return metrics;
}

void dump_logits(Experiment& e, const Dataset& dataset, int64_t count, const std::string& path) {
  LoaderOptions lo;
  lo.batch_size = std::max<int64_t>(1, std::min(count, dataset.size()));
  lo.num_workers = 1;
  std::shared_ptr<const Dataset> ds(std::shared_ptr<const Dataset>{}, &dataset);  // non-owning
  DataLoader loader(ds, EvalShard(dataset.size(), 1, 0).indices(), lo);
  std::optional<Batch> batch = loader.next();  // the first lo.batch_size samples, in dataset order
  if (!batch) throw std::runtime_error("--dump-logits: the test split is empty");
  const bool was_training = e.model->is_training();
  e.model->eval();
  NoGradGuard no_grad;
  const Tensor x =
      to_float_normalized(batch->images, e.normalization.mean, e.normalization.std);    // [N, C, H, W]
  const Tensor logits = (*e.model)(Variable(x.to(e.device))).data().to(Device::cpu());  // [N, classes]
  e.model->train(was_training);
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"images", x.contiguous()}, {"labels", batch->labels}, {"logits", logits.contiguous()}};
  save_safetensors(path, tensors, tensor_crc_metadata(tensors));
}

}  // namespace trainer
