#include "profile_table.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <unordered_map>
#include <utility>

namespace lamp_bench {
namespace {

bool is_marker(const std::string& name) {
  return name == kStepScope || name == kForwardScope;
}

// A CUDA runtime or driver call (cudaLaunchKernel, cuLaunchKernelEx): a
// host event of Kineto's, whose id is CUPTI's, not an op's.
bool is_runtime_call(const std::string& name) {
  return starts_with(name, "cuda") ||
         (starts_with(name, "cu") && name.size() > 2 &&
          std::isupper(static_cast<unsigned char>(name[2])));
}

bool is_engine_node(const std::string& name) {
  return starts_with(name, "autograd::engine::evaluate_function");
}

// The host events as a forest per thread: parents, children, the phase each
// runs in and the outermost classified op above each (its "root").
struct HostForest {
  std::vector<int64_t> parent;
  std::vector<std::vector<size_t>> children;
  std::vector<size_t> order; // parents before children
  std::vector<StepPhase> phase;
  std::vector<int64_t> root;
  std::vector<KernelClass> root_class; // of the roots only
};

HostForest build_forest(const std::vector<ProfiledEvent>& events) {
  const size_t n = events.size();
  HostForest f;
  f.parent.assign(n, -1);
  f.children.resize(n);
  f.phase.assign(n, StepPhase::kUnknown);
  f.root.assign(n, -1);
  f.root_class.assign(n, KernelClass::kOther);
  std::map<uint64_t, std::vector<size_t>> by_thread;
  for (size_t i = 0; i < n; ++i) {
    if (!events[i].device && !is_runtime_call(events[i].name)) {
      by_thread[events[i].thread].push_back(i);
    }
  }
  for (auto& entry : by_thread) {
    auto& ids = entry.second;
    // An enclosing event starts no later and, at the same start, lasts
    // longer: it comes first.
    std::sort(ids.begin(), ids.end(), [&](size_t a, size_t b) {
      const auto& x = events[a];
      const auto& y = events[b];
      if (x.start_ns != y.start_ns) {
        return x.start_ns < y.start_ns;
      }
      if (x.duration_ns != y.duration_ns) {
        return x.duration_ns > y.duration_ns;
      }
      return a < b;
    });
    // Ops on one thread nest, but their times are rounded: LibTorch 1.13's
    // microseconds put a child's end up to 1 us past its parent's.
    constexpr int64_t kSlackNs = 1000;
    std::vector<size_t> open;
    for (const auto i : ids) {
      const auto start = events[i].start_ns;
      const auto end = start + events[i].duration_ns;
      while (!open.empty()) {
        const auto& top = events[open.back()];
        const auto top_end = top.start_ns + top.duration_ns;
        if (start < top_end && end <= top_end + kSlackNs) {
          break;
        }
        open.pop_back();
      }
      if (!open.empty()) {
        f.parent[i] = static_cast<int64_t>(open.back());
        f.children[open.back()].push_back(i);
      }
      open.push_back(i);
      f.order.push_back(i);
    }
  }
  // The phase the children of each event run in.
  std::vector<StepPhase> inside(n, StepPhase::kUnknown);
  for (const auto i : f.order) {
    const auto& name = events[i].name;
    const auto p = f.parent[i];
    const auto inherited = p >= 0 ? inside[p] : StepPhase::kUnknown;
    if (name == kForwardScope) {
      inside[i] = StepPhase::kForward;
    } else if (is_engine_node(name)) {
      f.phase[i] = inside[i] = StepPhase::kBackward;
    } else if (name == kStepScope) {
      inside[i] = StepPhase::kUpdate;
    } else {
      f.phase[i] = inside[i] = inherited;
    }
    if (is_marker(name)) {
      continue; // scopes are no work of their own, and hold no class
    }
    if (p >= 0 && f.root[p] >= 0) {
      f.root[i] = f.root[p];
    } else {
      const auto c = classify(name, f.phase[i]);
      if (c != KernelClass::kOther) {
        f.root[i] = static_cast<int64_t>(i);
        f.root_class[i] = c;
      }
    }
  }
  return f;
}

// The largest FLOP estimate of the profiler in a subtree (nested
// convolution ops repeat their outer op's count where they have one).
int64_t subtree_flops(const std::vector<ProfiledEvent>& events,
                      const HostForest& f, size_t i) {
  int64_t best = events[i].flops;
  for (const auto child : f.children[i]) {
    best = std::max(best, subtree_flops(events, f, child));
  }
  return best;
}

// The FLOPs of a subtree's matrix products: each outermost product's
// estimate, summed (a backward node computes two; a product inside another
// repeats its count).
int64_t matmul_flops(const std::vector<ProfiledEvent>& events,
                     const HostForest& f, size_t i) {
  const auto& e = events[i];
  if (e.flops > 0 &&
      classify(e.name, StepPhase::kUnknown) == KernelClass::kMatmul) {
    return e.flops;
  }
  int64_t total = 0;
  for (const auto child : f.children[i]) {
    total += matmul_flops(events, f, child);
  }
  return total;
}

// The FLOPs of a convolution forward or matmul subtree.
int64_t class_flops(const std::vector<ProfiledEvent>& events,
                    const HostForest& f, size_t i, KernelClass c) {
  return c == KernelClass::kMatmul ? matmul_flops(events, f, i)
                                   : subtree_flops(events, f, i);
}

// The aten::convolution_backward in a subtree, or -1.
int64_t find_conv_backward(const std::vector<ProfiledEvent>& events,
                           const HostForest& f, size_t i) {
  if (events[i].name == "aten::convolution_backward") {
    return static_cast<int64_t>(i);
  }
  for (const auto child : f.children[i]) {
    const auto found = find_conv_backward(events, f, child);
    if (found >= 0) {
      return found;
    }
  }
  return -1;
}

// The outermost events of a subtree whose traffic is known.
void known_traffic(const std::vector<ProfiledEvent>& events,
                   const HostForest& f, size_t i, std::vector<size_t>& out) {
  const auto& e = events[i];
  if (traffic_bytes(e.name, e.shapes, e.dtypes) >= 0) {
    out.push_back(i);
    return;
  }
  for (const auto child : f.children[i]) {
    known_traffic(events, f, child, out);
  }
}

// The work a rate is computed over: its FLOPs or bytes, counted once, and
// the time spent on it.
struct Rated {
  double amount = 0;
  double seconds = 0;
};

class Table {
 public:
  Table(const std::vector<ProfiledEvent>& events, const ProfileRun& run)
      : events_(events), run_(run), forest_(build_forest(events)) {
    for (const auto c : kernel_classes()) {
      rows_[c].kernel_class = c;
    }
  }

  ProfileTable summarize() {
    if (run_.device_kernels) {
      add_device_kernels();
    } else {
      add_host_ops();
    }
    ProfileTable table;
    table.run = run_;
    table.events = static_cast<int64_t>(events_.size());
    double held = 0;
    for (const auto c : kernel_classes()) {
      auto row = rows_[c];
      for (const auto& entry : rated_) {
        if (entry.first.second == c) {
          (rated_in_flops(c) ? row.flops : row.bytes) += entry.second.amount;
          row.rated_seconds += entry.second.seconds;
        }
      }
      held += row.seconds;
      table.rows.push_back(row);
    }
    table.unaccounted_seconds = std::max(0.0, run_.seconds - held);
    return table;
  }

 private:
  // CPU: each class holds the whole time of its roots; "other" the rest of
  // the time of the ops directly inside the step's scopes.
  void add_host_ops() {
    double ops = 0, classified = 0;
    for (const auto i : forest_.order) {
      const auto& e = events_[i];
      if (is_marker(e.name) || forest_.phase[i] == StepPhase::kUnknown) {
        continue;
      }
      const auto p = forest_.parent[i];
      if (p < 0 || is_marker(events_[p].name)) {
        ops += seconds(e);
      }
      if (forest_.root[i] != static_cast<int64_t>(i)) {
        continue;
      }
      const auto c = forest_.root_class[i];
      rows_[c].seconds += seconds(e);
      classified += seconds(e);
      rate_host_root(i, c);
    }
    rows_[KernelClass::kOther].seconds += std::max(0.0, ops - classified);
  }

  void rate_host_root(size_t i, KernelClass c) {
    const auto& e = events_[i];
    if (c == KernelClass::kConvForward || c == KernelClass::kMatmul) {
      const auto flops = class_flops(events_, forest_, i, c);
      if (flops > 0) {
        rate(i, c, static_cast<double>(flops), seconds(e));
      }
    } else if (is_convolution(c)) {
      // The CPU's convolution_backward computes both gradients in one op,
      // the input's only where the input needs one.
      const auto op = find_conv_backward(events_, forest_, i);
      if (op < 0 || run_.input_shape.empty()) {
        return;
      }
      const auto& shapes = events_[op].shapes;
      const auto per_direction = conv_backward_flops_per_direction(shapes);
      if (per_direction < 0) {
        return;
      }
      const bool input_gradient = shapes[1] != run_.input_shape;
      rate(i, c, static_cast<double>(per_direction) * (input_gradient ? 2 : 1),
           seconds(e));
    } else if (c != KernelClass::kOther) {
      std::vector<size_t> known;
      known_traffic(events_, forest_, i, known);
      for (const auto k : known) {
        const auto& op = events_[k];
        rate(k, c,
             static_cast<double>(traffic_bytes(op.name, op.shapes, op.dtypes)),
             seconds(op));
      }
    }
  }

  // CUDA: each kernel's time goes to the class its name says, or else to
  // the class of the op that launched it.
  void add_device_kernels() {
    std::unordered_map<uint64_t, size_t> by_correlation;
    for (size_t i = 0; i < events_.size(); ++i) {
      if (!events_[i].device && events_[i].correlation != 0 &&
          !is_runtime_call(events_[i].name)) {
        by_correlation.emplace(events_[i].correlation, i);
      }
    }
    for (const auto& e : events_) {
      if (!e.device) {
        continue;
      }
      const auto found = by_correlation.find(e.linked_correlation);
      const int64_t op = found == by_correlation.end()
                             ? -1
                             : static_cast<int64_t>(found->second);
      const auto phase = op >= 0 ? forest_.phase[op] : StepPhase::kUnknown;
      auto c = classify(e.name, phase);
      const int64_t root = op >= 0 ? forest_.root[op] : -1;
      if (op >= 0 && inside_folded_conv(static_cast<size_t>(op))) {
        c = KernelClass::kConvBatchNorm;
      }
      if (root >= 0 && (c == KernelClass::kOther ||
                        (c == KernelClass::kMatmul &&
                         is_convolution(forest_.root_class[root])))) {
        // cuDNN runs some convolutions as GEMMs: they are the convolution's.
        c = forest_.root_class[root];
      }
      rows_[c].seconds += seconds(e);
      if (op >= 0) {
        rate_kernel(e, static_cast<size_t>(op), root, c);
      }
    }
  }

  // Whether `op` is, or runs inside, a lamp::folded_conv scope.
  bool inside_folded_conv(size_t op) const {
    for (int64_t i = static_cast<int64_t>(op); i >= 0;
         i = forest_.parent[static_cast<size_t>(i)]) {
      if (classify(events_[static_cast<size_t>(i)].name, StepPhase::kUnknown) ==
          KernelClass::kConvBatchNorm) {
        return true;
      }
    }
    return false;
  }

  void rate_kernel(const ProfiledEvent& kernel, size_t op, int64_t root,
                   KernelClass c) {
    if ((c == KernelClass::kConvForward || c == KernelClass::kMatmul) &&
        root >= 0) {
      const auto flops = class_flops(events_, forest_, root, c);
      if (flops > 0) {
        rate(root, c, static_cast<double>(flops), seconds(kernel));
      }
    } else if ((c == KernelClass::kConvDgrad || c == KernelClass::kConvWgrad) &&
               root >= 0) {
      // One direction per class: the forward's count, once per op however
      // many kernels it took.
      const auto conv = find_conv_backward(events_, forest_, root);
      const auto flops =
          conv >= 0 ? conv_backward_flops_per_direction(events_[conv].shapes)
                    : -1;
      if (flops >= 0) {
        rate(root, c, static_cast<double>(flops), seconds(kernel));
      }
    } else if (!rated_in_flops(c) && c != KernelClass::kOther) {
      // The outermost op with known traffic on the launching op's chain.
      int64_t known = -1;
      for (int64_t i = static_cast<int64_t>(op);
           i >= 0 && !is_marker(events_[i].name); i = forest_.parent[i]) {
        const auto& e = events_[i];
        if (traffic_bytes(e.name, e.shapes, e.dtypes) >= 0) {
          known = i;
        }
      }
      if (known >= 0) {
        const auto& e = events_[known];
        rate(static_cast<size_t>(known), c,
             static_cast<double>(traffic_bytes(e.name, e.shapes, e.dtypes)),
             seconds(kernel));
      }
    }
  }

  // Adds `spent` to the work of event `key` in class `c`; its amount counts
  // once.
  void rate(size_t key, KernelClass c, double amount, double spent) {
    auto& r = rated_[{key, c}];
    r.amount = amount;
    r.seconds += spent;
  }

  static double seconds(const ProfiledEvent& e) {
    return static_cast<double>(e.duration_ns) * 1e-9;
  }

  const std::vector<ProfiledEvent>& events_;
  ProfileRun run_;
  HostForest forest_;
  std::map<KernelClass, ClassRow> rows_;
  std::map<std::pair<size_t, KernelClass>, Rated> rated_;
};

std::string format_rate(double amount, double seconds, double unit) {
  if (amount <= 0 || seconds <= 0) {
    return "-";
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f", amount / seconds / unit);
  return text;
}

} // namespace

ProfileTable summarize(const std::vector<ProfiledEvent>& events,
                       const ProfileRun& run) {
  return Table(events, run).summarize();
}

std::string format_table(const ProfileTable& table) {
  const double steps =
      static_cast<double>(std::max<int64_t>(1, table.run.steps));
  const double step_seconds = table.run.seconds / steps;
  std::string out;
  char line[160];
  std::snprintf(line, sizeof(line), "%-14s %9s %7s %8s %8s %6s\n", "class",
                "ms/step", "share", "TFLOP/s", "GB/s", "rated");
  out += line;
  const auto share = [&](double seconds) {
    return table.run.seconds > 0 ? 100.0 * seconds / table.run.seconds : 0.0;
  };
  for (const auto& row : table.rows) {
    const bool in_flops = rated_in_flops(row.kernel_class);
    // A rate over a small part of a class would stand for all of it.
    const bool rated = row.rated_seconds >= kMinRatedShare * row.seconds;
    const auto tflops = in_flops && rated
                            ? format_rate(row.flops, row.rated_seconds, 1e12)
                            : "-";
    const auto gbps = !in_flops && rated
                          ? format_rate(row.bytes, row.rated_seconds, 1e9)
                          : "-";
    std::string covered = "-";
    if (row.rated_seconds > 0 && row.seconds > 0) {
      char text[16];
      std::snprintf(text, sizeof(text), "%.0f%%",
                    100.0 * row.rated_seconds / row.seconds);
      covered = text;
    }
    std::snprintf(line, sizeof(line), "%-14s %9.3f %6.1f%% %8s %8s %6s\n",
                  to_string(row.kernel_class).c_str(),
                  1e3 * row.seconds / steps, share(row.seconds), tflops.c_str(),
                  gbps.c_str(), covered.c_str());
    out += line;
  }
  std::snprintf(line, sizeof(line), "%-14s %9.3f %6.1f%%\n",
                table.run.device_kernels ? "no kernel" : "outside ops",
                1e3 * table.unaccounted_seconds / steps,
                share(table.unaccounted_seconds));
  out += line;
  std::snprintf(line, sizeof(line), "%-14s %9.3f %6.1f%%\n", "step",
                1e3 * step_seconds, table.run.seconds > 0 ? 100.0 : 0.0);
  out += line;
  return out;
}

std::vector<KernelTotal> top_kernels(const std::vector<ProfiledEvent>& events,
                                     const ProfileRun& run, size_t count) {
  if (!run.device_kernels) {
    return {};
  }
  std::map<std::string, KernelTotal> by_name;
  for (const auto& e : events) {
    if (!e.device) {
      continue;
    }
    auto& total = by_name[e.name];
    total.name = e.name;
    ++total.launches;
    total.seconds += static_cast<double>(e.duration_ns) * 1e-9;
  }
  std::vector<KernelTotal> all;
  all.reserve(by_name.size());
  for (auto& entry : by_name) {
    all.push_back(std::move(entry.second));
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const KernelTotal& a, const KernelTotal& b) {
                     return a.seconds > b.seconds;
                   });
  if (all.size() > count) {
    all.resize(count);
  }
  return all;
}

std::string format_top_kernels(const std::vector<KernelTotal>& kernels,
                               const ProfileRun& run) {
  if (kernels.empty()) {
    return "";
  }
  const double steps = static_cast<double>(std::max<int64_t>(1, run.steps));
  std::string out;
  char line[64];
  std::snprintf(line, sizeof(line), "%9s %7s %8s  %s\n", "ms/step", "share",
                "launches", "kernel");
  out += line;
  for (const auto& k : kernels) {
    std::snprintf(line, sizeof(line), "%9.3f %6.1f%% %8.1f  ",
                  1e3 * k.seconds / steps,
                  run.seconds > 0 ? 100.0 * k.seconds / run.seconds : 0.0,
                  static_cast<double>(k.launches) / steps);
    out += line;
    out += k.name.size() > kTopNameChars
               ? k.name.substr(0, kTopNameChars - 3) + "..."
               : k.name;
    out += "\n";
  }
  return out;
}

std::string trace_path_for(const std::string& path, const std::string& label,
                           bool several) {
  if (!several) {
    return path;
  }
  const auto slash = path.find_last_of('/');
  const auto name_start = slash == std::string::npos ? 0 : slash + 1;
  // A leading dot is part of the name (".trace.json" -> ".trace-amp.json").
  const auto dot = path.find('.', name_start + 1);
  if (dot == std::string::npos) {
    return path + "-" + label;
  }
  return path.substr(0, dot) + "-" + label + path.substr(dot);
}

bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::exists(a, error) && fs::exists(b, error)) {
    return fs::equivalent(a, b, error);
  }
  const auto absolute_a = fs::weakly_canonical(fs::absolute(a), error);
  const auto absolute_b = fs::weakly_canonical(fs::absolute(b), error);
  return !error && absolute_a == absolute_b;
}

nlohmann::json chrome_trace(const std::vector<ProfiledEvent>& events) {
  int64_t origin = 0;
  bool first = true;
  for (const auto& e : events) {
    if (first || e.start_ns < origin) {
      origin = e.start_ns;
      first = false;
    }
  }
  auto trace_events = nlohmann::json::array();
  for (const auto& e : events) {
    nlohmann::json args = nlohmann::json::object();
    if (!e.shapes.empty()) {
      args["Input Dims"] = e.shapes;
      args["Input type"] = e.dtypes;
    }
    if (e.flops > 0) {
      args["flops"] = e.flops;
    }
    if (e.correlation != 0) {
      args["correlation"] = e.correlation;
    }
    if (e.linked_correlation != 0) {
      args["linked correlation"] = e.linked_correlation;
    }
    trace_events.push_back(
        {{"ph", "X"},
         {"cat", e.device ? "kernel" : "cpu_op"},
         {"name", e.name},
         {"pid", e.device ? 1 : 0},
         {"tid", e.thread},
         {"ts", static_cast<double>(e.start_ns - origin) / 1e3},
         {"dur", static_cast<double>(e.duration_ns) / 1e3},
         {"args", args}});
  }
  return {{"displayTimeUnit", "ms"},
          {"traceEvents", trace_events},
          {"otherData", {{"writer", "lamp_bench"}}}};
}

} // namespace lamp_bench
