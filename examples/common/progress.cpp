#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include "cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

namespace lamp_examples {
namespace {

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", bytes / (1024.0 * 1024.0));
  return text;
}

// Seconds as "1:05" or "1:02:03" for ETAs.
std::string clock_time(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", total / 3600,
                  total / 60 % 60, total % 60);
  } else {
    std::snprintf(text, sizeof(text), "%lld:%02lld", total / 60, total % 60);
  }
  return text;
}

// The terminal's width in columns (stderr's), COLUMNS, or 80.
int terminal_width() {
  struct winsize size {};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    return size.ws_col;
  }
  if (const char* columns = std::getenv("COLUMNS")) {
    const int n = std::atoi(columns);
    if (n > 0) {
      return n;
    }
  }
  return 80;
}

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The bar's line: "epoch E/N [=====>    ] parts...", the parts after the bar
// dropped from the end while they do not fit in `width` columns, the bar
// left out where fewer than 5 columns remain for it.
std::string bar_line(const std::string& left,
                     const std::vector<std::string>& parts, int64_t batch,
                     int64_t batches, int width) {
  std::string right;
  for (const auto& part : parts) {
    if (!part.empty()) {
      right += " " + part;
    }
  }
  while (static_cast<int>(left.size() + right.size()) + 12 > width &&
         right.find(' ', 1) != std::string::npos) {
    right.erase(right.rfind(' '));
  }
  const int bar_width =
      width - static_cast<int>(left.size() + right.size()) - 3;
  std::string line = left;
  if (bar_width >= 5) {
    const int filled = static_cast<int>(bar_width * batch / batches);
    std::string bar(filled, '=');
    if (filled < bar_width) {
      bar += '>';
    }
    bar.resize(bar_width, ' ');
    line += " [" + bar + "]";
  }
  line += right;
  line.resize(std::min<size_t>(line.size(), width));
  return line;
}

// " (first 2 of 10 batches)" where the evaluation covered a subset of the
// test set, else ""; of the training data (--eval-train), whose batches
// are a random draw, not its first: " (2 of 10 batches)".
std::string subset_text(int64_t batches, int64_t in_set,
                        bool training_data = false) {
  return batches < in_set ? std::string(training_data ? " (" : " (first ") +
                                std::to_string(batches) + " of " +
                                std::to_string(in_set) + " batches)"
                          : "";
}

// "1/2", or "1/2 (partial: 20 of 469 steps)" for an epoch --max-steps cut
// short.
std::string epoch_text(const lamp::training::EpochStats& s, int64_t epochs) {
  auto text = std::to_string(s.epoch) + "/" + std::to_string(epochs);
  if (s.partial()) {
    text += " (partial: " + std::to_string(s.resumed_steps + s.steps) + " of " +
            std::to_string(s.steps_in_epoch) + " steps)";
  } else if (s.resumed_steps > 0) {
    text += " (resumed at step " + std::to_string(s.resumed_steps + 1) + ")";
  }
  return text;
}

// The epoch line's evaluation part, or "" where the run evaluates by steps
// instead.
std::string epoch_evaluation_text(const lamp::training::EpochStats& s,
                                  bool language_model) {
  return s.evaluated ? "  " + evaluation_text(
                                  s.test_loss, s.test_accuracy, s.test_batches,
                                  s.test_batches_in_set, language_model)
                     : "";
}

// What leads an evaluation's progress: its epoch and `space` ("epoch 2/5 ")
// inside a run; nothing for --eval-only's (epoch 0).
std::string evaluating_text(const lamp::training::EvalProgress& p,
                            int64_t epochs, const char* space) {
  return p.epoch > 0 ? "epoch " + std::to_string(p.epoch) + "/" +
                           std::to_string(epochs) + space
                     : std::string();
}

} // namespace

std::string evaluation_text(double loss, double accuracy, int64_t batches,
                            int64_t in_set, bool language_model,
                            bool training_data) {
  const auto subset = subset_text(batches, in_set, training_data);
  const std::string split =
      training_data ? "train" : (language_model ? "val" : "test");
  if (language_model) {
    return split + " loss " + fixed(loss, 4) + " (ppl " +
           perplexity_text(loss) + ")  " + split + " acc " +
           fixed(100.0 * accuracy, 2) + "%" + subset;
  }
  return split + " loss " + fixed(loss, 4) + "  " + split + " acc " +
         fixed(100.0 * accuracy, 2) + "%" + subset;
}

std::string eval_mode_text(
    const c10::optional<lamp::training::Evaluation>& train) {
  return train ? " (eval mode " + fixed(train->loss, 4) + ")" : "";
}

void LossWindow::add(const lamp::training::BatchProgress& p) {
  // The epoch's sum starts again (from what a resume inside it carried
  // on): so does the window. Its examples are those the clock timed: the
  // epoch's first batch has ended when the clock starts (Progress::update()),
  // so its loss counts and its examples do not.
  if (p.batch == p.resumed_batches + 1) {
    sum_at_ = p.resumed_loss_sum;
    non_finite_at_ = p.non_finite_before_epoch;
    batch_at_ = p.resumed_batches;
    examples_ = 0;
    return; // not timed: its examples do not count
  }
  examples_ += p.examples;
}

std::pair<double, int64_t> LossWindow::take(
    const lamp::training::BatchProgress& p) {
  const auto host = torch::stack({p.epoch_loss_sum.to(torch::kDouble),
                                  p.non_finite_losses.to(torch::kDouble)})
                        .cpu();
  const double sum = host[0].item<double>();
  const auto non_finite = static_cast<int64_t>(host[1].item<double>());
  const int64_t finite = (p.batch - batch_at_) - (non_finite - non_finite_at_);
  const double mean = finite > 0 ? (sum - sum_at_) / finite
                                 : std::numeric_limits<double>::quiet_NaN();
  const int64_t examples = examples_;
  sum_at_ = sum;
  non_finite_at_ = non_finite;
  batch_at_ = p.batch;
  examples_ = 0;
  return {mean, examples};
}

Progress::Progress(bool bar, bool timed_lines, int64_t log_every,
                   bool show_scale, int64_t epochs, JsonLog* log,
                   int64_t tokens_per_example, double mfu_per_example)
    : bar_(bar),
      timed_lines_(timed_lines),
      log_every_(log_every),
      show_scale_(show_scale),
      epochs_(epochs),
      log_(log),
      tokens_per_example_(tokens_per_example),
      mfu_per_example_(mfu_per_example) {}

double Progress::shown_rate(double examples_per_second) const {
  return tokens_per_example_ > 0
             ? examples_per_second * static_cast<double>(tokens_per_example_)
             : examples_per_second;
}

const char* Progress::rate_unit() const {
  return tokens_per_example_ > 0 ? "tok/s" : "img/s";
}

Progress Progress::for_program(const ProgramConfig& config, bool main_rank,
                               bool show_scale, JsonLog* log) {
  return Progress(main_rank && config.progress && isatty(STDERR_FILENO),
                  main_rank && config.progress && !isatty(STDOUT_FILENO),
                  main_rank ? config.log_every : 0, show_scale, config.epochs,
                  log, config.sequence_length,
                  config.flops_per_example > 0 && config.peak_flops > 0
                      ? config.flops_per_example / config.peak_flops
                      : 0.0);
}

std::function<void(const lamp::training::BatchProgress&)> Progress::on_batch() {
  if (!active()) {
    return nullptr;
  }
  return [this](const lamp::training::BatchProgress& p) { update(p); };
}

std::function<void(const lamp::training::EvalProgress&)>
Progress::on_eval_batch() {
  if (!active()) {
    return nullptr;
  }
  return [this](const lamp::training::EvalProgress& p) { update_eval(p); };
}

void Progress::update(const lamp::training::BatchProgress& p) {
  const auto now = std::chrono::steady_clock::now();
  // The clock starts as the epoch's first batch ends: the examples timed
  // are those after it (a line or the bar that counted them would
  // overstate the rate, most at the first line).
  if (p.batch == p.resumed_batches + 1) {
    epoch_start_ = line_start_ = last_line_ = now;
    epoch_examples_ = 0;
  } else {
    epoch_examples_ += p.examples;
  }
  if (bar_) {
    bar_window_.add(p);
  }
  if (log_every_ > 0 || timed_lines_) {
    line_window_.add(p); // a line covers steps of one epoch only
    if (log_every_ > 0 ? p.global_step % log_every_ == 0
                       : now - last_line_ >= std::chrono::seconds(30)) {
      write_line(p, now);
    }
  }
  if (bar_ && (p.batch == p.batches ||
               now - last_draw_ >= std::chrono::milliseconds(100))) {
    draw(p, now);
  }
}

void Progress::update_eval(const lamp::training::EvalProgress& p) {
  const auto now = std::chrono::steady_clock::now();
  if (p.batch == 1) {
    eval_start_ = now;
  }
  if (log_every_ > 0
          ? p.batch % log_every_ == 0
          : timed_lines_ && now - last_line_ >= std::chrono::seconds(30)) {
    clear();
    print_out(
        "%sevaluating%s  batch %lld/%lld%s\n",
        evaluating_text(p, epochs_, "  ").c_str(),
        p.training_data ? " the training data" : "",
        static_cast<long long>(p.batch), static_cast<long long>(p.batches),
        subset_text(p.batches_evaluated, p.batches_in_set, p.training_data)
            .c_str());
    last_line_ = now;
  }
  if (bar_ && (p.batch == p.batches ||
               now - last_draw_ >= std::chrono::milliseconds(100))) {
    draw_eval(p, now);
  }
}

void Progress::print_epoch(const lamp::training::EpochStats& s) {
  clear();
  const bool language_model = tokens_per_example_ > 0;
  // A language model: mean loss per token and its perplexity, exp(loss).
  const std::string train =
      (language_model ? fixed(s.train_loss, 4) + " (ppl " +
                            perplexity_text(s.train_loss) + ")"
                      : fixed(s.train_loss, 4)) +
      eval_mode_text(s.train_evaluation);
  // Model FLOPs utilisation, where the device's peak is known.
  const std::string mfu =
      mfu_per_example_ > 0
          ? "  MFU " +
                fixed(100.0 * s.examples_per_second * mfu_per_example_, 1) + "%"
          : "";
  print_out(
      "epoch %s  train loss %s%s  %.2f s  %.0f %s%s  peak %s  scale %g  "
      "skipped %lld%s\n",
      epoch_text(s, epochs_).c_str(), train.c_str(),
      epoch_evaluation_text(s, language_model).c_str(), s.seconds,
      shown_rate(s.examples_per_second), rate_unit(), mfu.c_str(),
      mib(s.peak_memory_bytes).c_str(), s.loss_scale,
      static_cast<long long>(s.skipped_steps),
      s.warmup_seconds > 0
          ? ("  warm-up " + fixed(s.warmup_seconds, 2) + " s").c_str()
          : "");
}

void Progress::print_evaluation(const lamp::training::StepEvaluation& e,
                                int64_t total_steps) {
  // The evaluation's time is no training time (the epoch's figures leave it
  // out too): the step line's window and the bar's rate start that much
  // later.
  const auto evaluating =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(e.eval_seconds));
  line_start_ += evaluating;
  epoch_start_ += evaluating;
  clear();
  const bool language_model = tokens_per_example_ > 0;
  const char* split = language_model ? "val" : "test";
  const std::string perplexity =
      language_model ? " (ppl " + perplexity_text(e.test_loss) + ")" : "";
  // Before the first step (--eval-at-start) no step has a training loss;
  // --eval-train's evaluation stands alone.
  std::string train;
  if (!e.before_training) {
    train = "train loss " + fixed(e.train_loss, 4) +
            eval_mode_text(e.train_evaluation) + "  ";
  } else if (e.train_evaluation) {
    train =
        "train loss (eval mode " + fixed(e.train_evaluation->loss, 4) + ")  ";
  }
  print_out(
      "step %lld/%lld  %s%s loss %.4f%s  %s acc %.2f%%%s  "
      "lr %.4g  %.2f s%s%s\n",
      static_cast<long long>(e.global_step),
      static_cast<long long>(total_steps), train.c_str(), split, e.test_loss,
      perplexity.c_str(), split, 100.0 * e.test_accuracy,
      subset_text(e.test_batches, e.test_batches_in_set).c_str(), e.lr,
      e.eval_seconds, e.best_written ? "  best, saved" : "",
      e.checkpoint_written ? "  checkpoint saved" : "");
}

void Progress::clear() {
  if (drawn_) {
    std::fprintf(stderr, "\r%*s\r", terminal_width() - 1, "");
    std::fflush(stderr);
    drawn_ = false;
  }
}

std::string Progress::scale_text(const lamp::training::BatchProgress& p) const {
  return show_scale_ && p.loss_scale.defined()
             ? "scale " + short_number(p.loss_scale.item<double>())
             : "";
}

void Progress::write_line(const lamp::training::BatchProgress& p,
                          std::chrono::steady_clock::time_point now) {
  const auto window = line_window_.take(p);
  const double elapsed = seconds(now - line_start_);
  // Nothing timed yet (a line after the epoch's first batch alone, as with
  // --log-every 1): "?" and null in the record, not 0.
  const bool timed = elapsed > 0 && window.second > 0;
  const double rate = timed ? window.second / elapsed
                            : std::numeric_limits<double>::quiet_NaN();
  const auto scale = scale_text(p);
  clear();
  // The record first: stdout gone stops the run with the log complete.
  if (log_ && log_every_ > 0) {
    log_->write_step(p, window.first, rate);
  }
  const std::string norm =
      p.grad_norm.defined()
          ? "  grad norm " + short_number(p.grad_norm.item<double>())
          : "";
  print_out(
      "epoch %lld/%lld  step %lld/%lld  loss %.4f  %s %s  lr %.4g%s%s%s\n",
      static_cast<long long>(p.epoch), static_cast<long long>(epochs_),
      static_cast<long long>(p.batch), static_cast<long long>(p.batches),
      window.first, timed ? fixed(shown_rate(rate), 0).c_str() : "?",
      rate_unit(), p.lr, norm.c_str(), scale.empty() ? "" : "  ",
      scale.c_str());
  line_start_ = last_line_ = now;
}

void Progress::draw_bar(const std::string& left,
                        const std::vector<std::string>& parts, int64_t done,
                        int64_t total) {
  const int width = terminal_width() - 1;
  std::fprintf(stderr, "\r%-*s", width,
               bar_line(left, parts, done, total, width).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::draw(const lamp::training::BatchProgress& p,
                    std::chrono::steady_clock::time_point now) {
  last_draw_ = now;
  const double elapsed = seconds(now - epoch_start_);
  const double rate = elapsed > 0 ? epoch_examples_ / elapsed : 0.0;
  const int64_t done = p.batch - p.resumed_batches; // in this run
  // The clock has timed the batches after the first.
  const double eta =
      done > 1 ? elapsed * (p.batches - p.batch) / (done - 1) : 0.0;
  const double loss = bar_window_.take(p).first;
  const auto left =
      "epoch " + std::to_string(p.epoch) + "/" + std::to_string(epochs_);
  const std::vector<std::string> parts = {
      std::to_string(p.batch) + "/" + std::to_string(p.batches),
      "loss " + (std::isfinite(loss) ? fixed(loss, 4) : std::string("nan")),
      // Nothing is timed yet after the first batch (as tqdm's "?").
      (done > 1 ? fixed(shown_rate(rate), 0) : std::string("?")) + " " +
          rate_unit(),
      scale_text(p), "ETA " + (done > 1 ? clock_time(eta) : std::string("?"))};
  draw_bar(left, parts, p.batch, p.batches);
}

void Progress::draw_eval(const lamp::training::EvalProgress& p,
                         std::chrono::steady_clock::time_point now) {
  last_draw_ = now;
  const double elapsed = seconds(now - eval_start_);
  const double eta = elapsed * (p.batches - p.batch) / p.batch;
  const auto left =
      evaluating_text(p, epochs_, " ") + (p.training_data ? "train" : "test");
  const std::vector<std::string> parts = {
      std::to_string(p.batch) + "/" + std::to_string(p.batches) +
          subset_text(p.batches_evaluated, p.batches_in_set, p.training_data),
      "ETA " + (p.batch > 1 ? clock_time(eta) : std::string("?"))};
  draw_bar(left, parts, p.batch, p.batches);
}

} // namespace lamp_examples
