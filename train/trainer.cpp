#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>

#include "backend/sgemm_rate.h"
#include "checkpoint/local.h"
#include "core/error.h"
#include "core/log.h"
#include "data/byte_tokenizer.h"
#include "data/data_split.h"
#include "data/window_sampler.h"
#include "data/token_dataset.h"
#include "model/generate.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"
#include "train/engine.h"
#include "train/metrics.h"
#include "train/schedule.h"

namespace mx {

namespace {

std::atomic<int> g_stop_signal{0};
void on_signal(int sig) { g_stop_signal.store(sig); }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The model the run trains: from init.from's config.json when given, else the config's.
ModelConfig resolve_model(const RunConfig& cfg) {
  if (cfg.init.from.empty()) return cfg.model;
  MX_REQUIRE(is_hf_dir(cfg.init.from), "init.from: ", cfg.init.from,
             " is not a Hugging Face model directory (no config.json)");
  return read_hf_config(cfg.init.from + "/config.json");
}

}  // namespace

int run_training(const RunConfig& cfg) {
  if (cfg.run.threads > 0) omp_set_num_threads(int(cfg.run.threads));
  const auto& tc = cfg.train;
  const int64_t B = tc.micro_batch, T = tc.seq_len;
  const ModelConfig model_cfg = resolve_model(cfg);

  // Data first: a bad data file should fail before any memory is committed.
  const std::string data_path = cfg.data.path.empty() ? MXTRAIN_DEFAULT_CORPUS : cfg.data.path;
  TokenFormat format = parse_token_format(cfg.data.format);
  if (cfg.data.path.empty() && format != TokenFormat::kRandom) {
    MX_REQUIRE(std::filesystem::exists(data_path), "data.path is not set and the bundled corpus ",
               data_path, " is missing (run scripts/setup.sh, or set data.path)");
  }
  TokenDataset data = TokenDataset::open(data_path, format, model_cfg.vocab_size);
  DataSplit split = split_train_val(data.size(), cfg.data.val_fraction, T);
  WindowSampler train_sampler(&data, split.train_begin, split.train_end, T, uint64_t(tc.seed),
                              cfg.data.shuffle);
  std::unique_ptr<WindowSampler> val_sampler;
  if (tc.eval_every > 0 && split.val_end - split.val_begin >= T + 1)
    val_sampler = std::make_unique<WindowSampler>(&data, split.val_begin, split.val_end, T,
                                                  uint64_t(tc.seed) + 1, false);
  else if (tc.eval_every > 0)
    warn("validation is off: the held-out data (data.val_fraction) is shorter than seq_len + 1");

  EngineOptions eo;
  eo.device = cfg.run.device;
  eo.checkpointing = parse_checkpointing(cfg.memory.activation_checkpointing);
  eo.micro_batch = B;
  eo.seq_len = T;
  Engine engine(model_cfg, eo);
  Backend& be = *engine.backend;
  float* P = engine.param_data();
  float* G = engine.grad_data();
  const int64_t n_params = engine.layout.total_numel();

  // Resume or initialize.
  int64_t start_step = 0;
  std::string resume_from;
  const std::string ckpt_root = cfg.checkpoint_dir();
  if (cfg.checkpoint.resume == "auto") resume_from = latest_checkpoint(ckpt_root);
  else if (cfg.checkpoint.resume != "none") resume_from = resolve_checkpoint(cfg.checkpoint.resume);
  if (!resume_from.empty()) {
    ModelConfig saved_cfg = checkpoint_model_config(resume_from);
    MX_REQUIRE(saved_cfg.param_count() == model_cfg.param_count() &&
                   saved_cfg.hidden_size == model_cfg.hidden_size &&
                   saved_cfg.num_hidden_layers == model_cfg.num_hidden_layers,
               "checkpoint ", resume_from, " holds a different model than this config");
    auto state = checkpoint_state(resume_from);
    load_local_checkpoint(resume_from, engine.layout, P, engine.m_data(), engine.v_data());
    start_step = state["step"].get<int64_t>();
    MX_REQUIRE(start_step <= tc.steps, "checkpoint ", resume_from, " is at step ", start_step,
               ", past train.steps = ", tc.steps);
    info("resumed from ", resume_from, " at step ", start_step);
  } else if (!cfg.init.from.empty()) {
    load_hf_weights(cfg.init.from, engine.layout, P);
    info("initialized from ", cfg.init.from);
  } else {
    init_params(engine.layout, P, uint64_t(tc.seed));
  }

  const double peak_flops = measure_sgemm_flops(be, 1024, 3);
  const int64_t tokens_per_step = B * T * tc.grad_accum;
  const double flops_per_token = model_cfg.flops_per_token(T);
  info("mxtrain: ", format_count(double(model_cfg.param_count())), " parameters (",
       model_cfg.num_hidden_layers, " x ", model_cfg.hidden_size, ", ",
       model_cfg.num_attention_heads, " heads / ", model_cfg.num_key_value_heads, " kv), ",
       "data ", data_path, " (", format_count(double(data.size())), " tokens), ",
       B, " x ", T, " x ", tc.grad_accum, " = ", tokens_per_step, " tokens/step, ",
       "checkpointing ", cfg.memory.activation_checkpointing, ", ", omp_get_max_threads(),
       " threads, SGEMM ", format_count(peak_flops), "FLOP/s");

  MetricsWriter metrics(cfg.metrics_path(), start_step > 0);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  // Validation loss on a fixed set of held-out windows, so evaluations are comparable.
  auto evaluate = [&]() {
    double sum = 0;
    for (int64_t i = 0; i < tc.eval_batches; ++i) {
      val_sampler->fill(i * B, B, engine.batch_tokens());
      sum += engine.model->forward_loss(P, engine.batch_tokens(), B, T);
    }
    return sum / double(tc.eval_batches);
  };

  auto save = [&](int64_t step) {
    nlohmann::json state = {{"samples_seen", step * tc.grad_accum * B},
                            {"seed", tc.seed},
                            {"data_path", data_path}};
    std::string dir = save_local_checkpoint(ckpt_root, step, model_cfg, engine.layout, P,
                                            engine.m_data(), engine.v_data(), state);
    prune_checkpoints(ckpt_root, cfg.checkpoint.keep);
    return dir;
  };

  const bool tty = ::isatty(STDERR_FILENO);
  auto run_t0 = Clock::now();
  double tokens_done = 0, last_loss = NAN, train_seconds = 0;
  be.reset_gemm_stats();
  int64_t step = start_step;
  for (; step < tc.steps; ++step) {
    if (g_stop_signal.load()) break;
    auto t0 = Clock::now();
    const double lr = lr_at(step, tc.steps, tc.warmup_steps, tc.lr, tc.min_lr);
    be.fill(G, 0.0f, n_params);
    double loss = 0;
    for (int64_t m = 0; m < tc.grad_accum; ++m) {
      int64_t first = (step * tc.grad_accum + m) * B;
      train_sampler.fill(first, B, engine.batch_tokens());
      loss += engine.model->forward_backward(P, G, engine.batch_tokens(), B, T,
                                             1.0f / float(tc.grad_accum));
    }
    loss /= double(tc.grad_accum);
    MX_REQUIRE(std::isfinite(loss), "loss is ", loss, " at step ", step + 1,
               ": training diverged (lower train.lr or set train.grad_clip)");
    const double grad_norm = std::sqrt(be.sum_squares(G, n_params));
    if (tc.grad_clip > 0 && grad_norm > tc.grad_clip)
      be.scale(G, float(tc.grad_clip / (grad_norm + 1e-6)), n_params);
    for (const ParamTensor& t : engine.layout.tensors())
      be.adamw(P + t.offset, G + t.offset, engine.m_data() + t.offset,
               engine.v_data() + t.offset, t.numel, float(lr), float(tc.beta1),
               float(tc.beta2), float(tc.eps), t.decay ? float(tc.weight_decay) : 0.0f,
               step + 1);
    const double dt = seconds_since(t0);
    train_seconds += dt;
    tokens_done += double(tokens_per_step);
    last_loss = loss;
    const int64_t done = step + 1;
    const double tok_s = double(tokens_per_step) / dt;
    const double mfu = flops_per_token * tok_s / peak_flops;

    nlohmann::json rec;
    bool log_now = done % tc.log_every == 0 || done == tc.steps;
    if (val_sampler && (done % tc.eval_every == 0 || done == tc.steps)) {
      rec["val_loss"] = evaluate();
      log_now = true;
    }
    if (log_now) {
      rec["step"] = done;
      rec["loss"] = loss;
      rec["lr"] = lr;
      rec["grad_norm"] = grad_norm;
      rec["tokens_per_s"] = tok_s;
      rec["mfu"] = mfu;
      rec["peak_mem_bytes"] = engine.tracker.peak();
      rec["step_time_s"] = dt;
      metrics.write(rec);
      const double eta = train_seconds / double(done - start_step) * double(tc.steps - done);
      std::string line = str("step ", done, "/", tc.steps, " | loss ", loss);
      if (rec.contains("val_loss")) line += str(" | val ", rec["val_loss"].get<double>());
      char extra[160];
      std::snprintf(extra, sizeof extra, " | lr %.2e | %s tok/s | MFU %.1f%% | mem %s | ETA %s", lr,
                    format_count(tok_s).c_str(), 100 * mfu,
                    format_bytes(double(engine.tracker.peak())).c_str(),
                    format_duration(eta).c_str());
      line += extra;
      if (tty && !rec.contains("val_loss") && done != tc.steps)
        std::fprintf(stderr, "\r%s\033[K", line.c_str());
      else
        std::fprintf(stderr, "\r%s\033[K\n", line.c_str());
      std::fflush(stderr);
    }
    if (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0 && done != tc.steps) save(done);
  }

  const int sig = g_stop_signal.load();
  std::string final_dir = step > start_step || start_step == tc.steps || sig ? save(step) : "";
  auto stats = be.gemm_stats();
  nlohmann::json summary = {
      {"summary", true},
      {"steps", step},
      {"final_loss", last_loss},
      {"tokens", tokens_done},
      {"tokens_per_s", train_seconds > 0 ? tokens_done / train_seconds : 0.0},
      {"mfu", train_seconds > 0 ? flops_per_token * tokens_done / train_seconds / peak_flops : 0.0},
      {"peak_mem_bytes", engine.tracker.peak()},
      {"gemm_gflops", stats.seconds > 0 ? stats.flops / stats.seconds / 1e9 : 0.0},
      {"gemm_seconds", stats.seconds},
      {"train_seconds", train_seconds},
      {"sgemm_peak_gflops", peak_flops / 1e9},
      {"checkpoint", final_dir},
      {"wall_seconds", seconds_since(run_t0)}};
  if (sig) summary["stopped_by_signal"] = sig;
  metrics.write(summary);
  if (sig) {
    info("stopped by signal ", sig, " at step ", step, "; checkpoint ", final_dir);
    return sig == SIGINT ? 130 : 143;
  }
  info("done: ", step, " steps, final loss ", last_loss, ", ",
       format_count(summary["tokens_per_s"].get<double>()), " tok/s, peak memory ",
       format_bytes(double(engine.tracker.peak())), ", checkpoint ", final_dir, ", metrics ",
       metrics.path());

  if (cfg.run.sample_tokens > 0 && model_cfg.vocab_size >= 256) {
    SampleOptions so;
    so.max_new_tokens = cfg.run.sample_tokens;
    so.seed = uint64_t(tc.seed);
    auto prompt = byte_encode(cfg.run.sample_prompt.empty() ? "\n" : cfg.run.sample_prompt);
    auto ids = generate_tokens(model_cfg, engine.layout, be, P, prompt, so);
    std::printf("--- sample (temperature %.1f, top-k %lld) ---\n%s\n---\n", so.temperature,
                static_cast<long long>(so.top_k), byte_decode(ids).c_str());
  }
  return 0;
}

}  // namespace mx
