// Settings files (examples/common/config_file.h): lamp's key = value lines
// and Python assignments read, each refusal naming the file and line; the
// command line winning over the file; nanoGPT's config files as train_gpt's
// flags (examples/common/nanogpt_config.h), train.py's defaults where a file
// is silent.

#include <ftw.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/config_file.h"
#include "common/nanogpt_config.h"

namespace {

using lamp_examples::ConfigFileError;

// POSIX rather than std::filesystem, whose copy exported by the torch
// wheels crashes in remove_all() (pytorch/pytorch#133437).

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The folders test_folder() made, removed when the tests end.
struct MadeFolders {
  std::vector<std::string> paths;
  ~MadeFolders() {
    for (const auto& path : paths) {
      ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
  }
};

// A fresh folder for the test's files.
std::string test_folder() {
  static MadeFolders made;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string base = ::testing::TempDir();
  if (base.empty() || base.back() != '/') {
    base += '/';
  }
  const auto folder = base + "lamp_config_" + info->name();
  ::nftw(folder.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  ::mkdir(folder.c_str(), 0777);
  made.paths.push_back(folder);
  return folder;
}

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// The message `body` throws as ConfigFileError ("" when it throws none).
template <typename F>
std::string refusal(F&& body) {
  try {
    body();
  } catch (const ConfigFileError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

std::string literal(const std::string& expression) {
  std::string text;
  bool none = false;
  if (!lamp_examples::evaluate_python_literal(expression, text, none)) {
    return "<not evaluated>";
  }
  return none ? "<None>" : text;
}

TEST(ConfigFile, PythonLiteralsAsAConfigFileWritesThem) {
  EXPECT_EQ(literal("5 * 8"), "40");
  EXPECT_EQ(literal("6e-4"), "0.0006");
  EXPECT_EQ(literal("1e-3"), "0.001");
  EXPECT_EQ(literal("1E+2"), "100"); // an integral float as an integer
  EXPECT_EQ(literal("1e5"), "100000");
  EXPECT_EQ(literal("2.0"), "2");
  EXPECT_EQ(literal("1_000_000"), "1000000");
  EXPECT_EQ(literal("(12 + 4) // 3"), "5");
  EXPECT_EQ(literal("-7 // 2"), "-4"); // Python floors
  EXPECT_EQ(literal("-7 % 3"), "2");
  EXPECT_EQ(literal("7 / 2"), "3.5");
  EXPECT_EQ(literal("2 ** 10"), "1024");
  EXPECT_EQ(literal("-2 ** 2"), "-4"); // ** binds tighter than unary minus
  EXPECT_EQ(literal("2 * 3 ** 2"), "18");
  EXPECT_EQ(literal("2 ** -1"), "0.5");  // a signed exponent
  EXPECT_EQ(literal("10 - 2 - 3"), "5"); // left to right
  EXPECT_EQ(literal("0.5"), "0.5");
  EXPECT_EQ(literal(".25"), "0.25");
  EXPECT_EQ(literal("True"), "true");
  EXPECT_EQ(literal("False"), "false");
  EXPECT_EQ(literal("None"), "<None>");
  EXPECT_EQ(literal("'out-shakespeare'"), "out-shakespeare");
  EXPECT_EQ(literal("\"a\\\"b\""), "a\"b");
  EXPECT_EQ(literal("'FILE:prompt.txt'"), "FILE:prompt.txt");
  for (const char* refused :
       {"'ft-' + str(time.time())", "max_iters", "1 / 0", "2 *", "'a' 'b'",
        "(1 + 2", "1e", "[1, 2]", "'''doc'''", "abs(-1)", ""}) {
    EXPECT_EQ(literal(refused), "<not evaluated>") << refused;
  }
  // Nested as deep as Python takes (it refuses 200 nested parentheses),
  // and far deeper refused (a recursion a level: not a stack overflow).
  EXPECT_EQ(literal(std::string(150, '(') + "7" + std::string(150, ')')), "7");
  EXPECT_EQ(literal(std::string(150, '-') + "7"), "7");
  EXPECT_EQ(literal("2 ** " + std::string(149, '-') + "1"), "0.5");
  EXPECT_EQ(literal(std::string(200000, '(') + "1" + std::string(200000, ')')),
            "<not evaluated>");
  EXPECT_EQ(literal(std::string(300000, '-') + "1"), "<not evaluated>");
  EXPECT_EQ(literal(std::string(201, '(') + "1" + std::string(201, ')')),
            "<not evaluated>");
}

TEST(ConfigFile, ReadsKeyValueLines) {
  const auto folder = test_folder();
  const auto path = write(folder + "/run.toml",
                          "# a run\n"
                          "\n"
                          "layers = 4   # comment\n"
                          "eval_every=250\n"
                          "prompt = \"The #1 \\\"best\\\"\"\n"
                          "data = '/data/a b'\n"
                          "eval-train = true\n");
  const auto file = lamp_examples::read_config_file(path);
  EXPECT_FALSE(file.python);
  ASSERT_EQ(file.settings.size(), 5u);
  EXPECT_EQ(file.settings[0].key, "layers");
  EXPECT_EQ(file.settings[0].value, "4");
  EXPECT_EQ(file.settings[0].line, 3);
  EXPECT_EQ(file.settings[1].key, "eval_every");
  EXPECT_EQ(file.settings[1].value, "250");
  EXPECT_EQ(file.settings[2].value, "The #1 \"best\"");
  EXPECT_TRUE(file.settings[2].quoted);
  EXPECT_EQ(file.settings[3].value, "/data/a b");
  EXPECT_EQ(file.settings[4].value, "true");
  EXPECT_EQ(file.where(file.settings[0]), path + " line 3 (layers = 4)");
  EXPECT_EQ(file.where(file.settings[3]),
            path + " line 6 (data = '/data/a b')");
}

TEST(ConfigFile, RefusesWhatItDoesNotReadNamingTheLine) {
  const auto folder = test_folder();
  const auto read = [&](const std::string& text) {
    const auto path = write(folder + "/bad.toml", text);
    return refusal([&] { lamp_examples::read_config_file(path); });
  };
  EXPECT_HAS(read("layers = 2\nlayers = 3\n"),
             "bad.toml line 2: layers is set again (first on line 1)");
  EXPECT_HAS(read("[train]\nlayers = 2\n"), "bad.toml line 1: tables");
  EXPECT_HAS(read("ids = [1, 2]\n"), "give a list as one string");
  EXPECT_HAS(read("layers\n"), "bad.toml line 1: 'layers' is not a setting");
  EXPECT_HAS(read("layers =\n"), "layers has no value");
  EXPECT_HAS(read("prompt = \"open\n"), "the string \"open is not closed");
  EXPECT_HAS(read("lay ers = 2\n"), "'lay ers' is not a flag's name");
  EXPECT_HAS(refusal([&] {
               lamp_examples::read_config_file(folder + "/missing.toml");
             }),
             "--config " + folder + "/missing.toml: no such file");
  // Python: the last assignment holds, imports are skipped, and what is not
  // an assignment is refused.
  const auto py = write(folder + "/c.py",
                        "\"\"\"A recipe.\n"
                        "It sets the shape (nothing here is read).\n"
                        "n_layer = 1 inside the docstring\n"
                        "\"\"\"\n"
                        "'''one line'''\n"
                        "import time\n"
                        "n_layer = 4\n"
                        "wandb_run_name = 'ft-' + str(time.time())\n"
                        "n_layer = 6 # again\n");
  const auto file = lamp_examples::read_config_file(py);
  EXPECT_TRUE(file.python);
  ASSERT_EQ(file.settings.size(), 2u);
  EXPECT_EQ(file.settings[0].value, "6");
  EXPECT_EQ(file.settings[0].line, 9);
  EXPECT_FALSE(file.settings[1].evaluated);
  EXPECT_EQ(file.settings[1].value, "'ft-' + str(time.time())");
  for (const char* statement :
       {"print(1)\n", "n_layer += 1\n", "n_layer == 1\n", "2x = 1\n"}) {
    write(py, statement);
    EXPECT_HAS(refusal([&] { lamp_examples::read_config_file(py); }),
               "c.py line 1: ");
  }
}

// A program's flags, for with_config_settings().
struct Program {
  CLI::App app{"test"};
  int64_t layers = 0;
  std::string data;
  int64_t batches = 0;
  bool eval_train = false;
  std::string config;
  Program() {
    app.add_option("--layers", layers);
    app.add_option("--data", data);
    app.add_option("--limit-eval-batches,--eval-batches", batches);
    app.add_flag("--eval-train", eval_train);
    app.add_option("--config", config);
  }
};

std::vector<std::string> expand(
    const Program& program, const std::vector<std::string>& args,
    const lamp_examples::PythonConfigReader& python = {}) {
  std::map<std::string, std::string> sources;
  std::vector<std::string> notes;
  return lamp_examples::with_config_settings(program.app, args, python, sources,
                                             notes);
}

TEST(ConfigFile, TheCommandLineWinsOverTheFile) {
  const auto folder = test_folder();
  const auto path = write(folder + "/run.toml",
                          "layers = 4\ndata = 'a b'\nlimit_eval_batches = 5\n"
                          "eval-train = true\n");
  Program program;
  // --eval-batches is --limit-eval-batches by another name: given.
  EXPECT_EQ(
      expand(program, {"--config", path, "--layers", "2", "--eval-batches=7"}),
      (std::vector<std::string>{"--config", path, "--layers", "2",
                                "--eval-batches=7", "--data=a b",
                                "--eval-train"}));
  EXPECT_EQ(
      expand(program, {"--config=" + path}),
      (std::vector<std::string>{"--config=" + path, "--layers=4", "--data=a b",
                                "--limit-eval-batches=5", "--eval-train"}));
  // A flag the command line's flags exclude is left out too, with a note:
  // --resume over a file's --init-from.
  {
    const auto start = write(folder + "/start.toml", "init-from = 'a.pt'\n");
    CLI::App app{"test"};
    std::string resume, init_from, config;
    auto* resumed = app.add_option("--resume", resume);
    app.add_option("--init-from", init_from)->excludes(resumed);
    app.add_option("--config", config);
    std::map<std::string, std::string> sources;
    std::vector<std::string> notes;
    EXPECT_EQ(
        lamp_examples::with_config_settings(
            app, {"--config", start, "--resume", "b.pt"}, {}, sources, notes),
        (std::vector<std::string>{"--config", start, "--resume", "b.pt"}));
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_HAS(notes[0],
               "start.toml line 1 (init-from = 'a.pt'): left out, "
               "as the command line's --resume excludes "
               "--init-from.");
    EXPECT_EQ(
        lamp_examples::with_config_settings(app, {"--config", start}, {},
                                            sources, notes),
        (std::vector<std::string>{"--config", start, "--init-from=a.pt"}));
  }
  // Without --config, or with --help: the command line as it is.
  EXPECT_EQ(expand(program, {"--layers", "2"}),
            (std::vector<std::string>{"--layers", "2"}));
  EXPECT_EQ(expand(program, {"--config", path, "--help"}),
            (std::vector<std::string>{"--config", path, "--help"}));
  // A switch set false is left out.
  write(path, "eval-train = false\n");
  EXPECT_EQ(expand(program, {"--config", path}),
            (std::vector<std::string>{"--config", path}));
}

TEST(ConfigFile, RefusesKeysAndValuesTheProgramDoesNotTake) {
  const auto folder = test_folder();
  Program program;
  const auto refused = [&](const std::string& text,
                           std::vector<std::string> args = {}) {
    const auto path = write(folder + "/run.toml", text);
    args.insert(args.begin(), {"--config", path});
    return refusal([&] { expand(program, args); });
  };
  EXPECT_HAS(refused("layer = 4\n"),
             "run.toml line 1 (layer = 4): --layer is not a flag of this "
             "program; did you mean --layers?");
  EXPECT_HAS(refused("eval-train = yes\n"),
             "--eval-train is a switch: give true");
  EXPECT_HAS(refused("config = 'other.toml'\n"),
             "--config belongs on the command line");
  EXPECT_HAS(refused("eval-batches = 1\nlimit-eval-batches = 2\n"),
             "both set --limit-eval-batches");
  EXPECT_HAS(refused("layers = 1\n", {"--config", "x.toml"}),
             "--config is given 2 times");
  const auto py = write(folder + "/c.py", "n_layer = 4\n");
  EXPECT_HAS(refusal([&] {
               expand(program, {"--config", py});
             }),
             "not Python; nanoGPT's config files are train_gpt's");
}

// parse_command_line() with a settings file: its values reach the flags, a
// bad one is refused as a usage error naming its line.
TEST(ConfigFile, ParseCommandLineReadsTheFile) {
  const auto folder = test_folder();
  const auto path =
      write(folder + "/run.toml", "count = 12\nrate = 0.5\nname = 'a b'\n");
  int64_t count = 0;
  double rate = 0;
  std::string name;
  CLI::App app{"test"};
  app.add_option("--count", count)->check(lamp_examples::integer_in(1, 100));
  app.add_option("--rate", rate);
  app.add_option("--name", name);
  std::vector<std::string> args = {"prog", "--config", path, "--rate", "0.25"};
  std::vector<char*> argv;
  for (auto& arg : args) {
    argv.push_back(arg.data());
  }
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(lamp_examples::parse_command_line(
                app, "prog", static_cast<int>(argv.size()), argv.data()),
            -1);
  const auto said = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(count, 12);
  EXPECT_EQ(rate, 0.25);
  EXPECT_EQ(name, "a b");
  // As the shell would take them back.
  EXPECT_HAS(said,
             "prog: --config " + path + " gives --count=12 '--name=a b'\n");

  write(path, "count = 0101\n");
  CLI::App again{"test"};
  again.add_option("--count", count)->check(lamp_examples::integer_in(1, 100));
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(lamp_examples::parse_command_line(
                again, "prog", static_cast<int>(argv.size()) - 2, argv.data()),
            lamp_examples::kUsageError);
  const auto printed = ::testing::internal::GetCapturedStderr();
  EXPECT_HAS(printed,
             "prog: error: --count: 101 is out of range: give an "
             "integer in 1..100 (set by " +
                 path + " line 1 (count = 0101))");
}

TEST(ConfigFile, ErrorsAfterParsingNameTheLinesThatSetTheirFlags) {
  // What parse_command_line() records, and the note an error found later
  // gets from it: each flag the message names, in the message's order.
  const auto folder = test_folder();
  const auto path =
      write(folder + "/later.toml",
            "steps = 10\nwarmup-steps = 20\nsteps-per-epoch = 3\n");
  int64_t steps = 0, warmup = 0, per_epoch = 0;
  CLI::App app{"test"};
  app.add_option("--steps", steps)->check(lamp_examples::integer_in(1, 100));
  app.add_option("--warmup-steps", warmup)
      ->check(lamp_examples::integer_in(0, 100));
  app.add_option("--steps-per-epoch", per_epoch)
      ->check(lamp_examples::integer_in(1, 100));
  std::vector<std::string> args = {"prog", "--config", path};
  std::vector<char*> argv;
  for (auto& arg : args) {
    argv.push_back(arg.data());
  }
  lamp_examples::SettingsSources sources;
  sources["--stale"] = "from an earlier parse"; // cleared
  ::testing::internal::CaptureStdout();
  ASSERT_EQ(lamp_examples::parse_command_line(app, "prog",
                                              static_cast<int>(argv.size()),
                                              argv.data(), {}, &sources),
            -1);
  ::testing::internal::GetCapturedStdout();
  const lamp_examples::SettingsSources expected = {
      {"--steps", path + " line 1 (steps = 10)"},
      {"--warmup-steps", path + " line 2 (warmup-steps = 20)"},
      {"--steps-per-epoch", path + " line 3 (steps-per-epoch = 3)"}};
  EXPECT_EQ(sources, expected);
  using lamp_examples::settings_file_note;
  // Two flags, in the order the message names them (not the map's).
  EXPECT_EQ(settings_file_note(
                "--warmup-steps 20 is not shorter than --steps 10", sources),
            " (set by " + path + " line 2 (warmup-steps = 20); " + path +
                " line 1 (steps = 10))");
  // A flag whose name goes on is another flag: --steps-per-epoch alone.
  EXPECT_EQ(settings_file_note("--steps-per-epoch 3 is too many", sources),
            " (set by " + path + " line 3 (steps-per-epoch = 3))");
  // Named twice, noted once; a flag the file did not set, not at all.
  EXPECT_EQ(settings_file_note("--steps 10: --steps must be more", sources),
            " (set by " + path + " line 1 (steps = 10))");
  EXPECT_EQ(settings_file_note("--lr 5 is too high", sources), "");
  EXPECT_EQ(settings_file_note("--steps 10 is too few", {}), "");
  // A name with an underscore after it is another name (nanoGPT's
  // --steps_x), not --steps.
  EXPECT_EQ(settings_file_note("not expected: --steps_x=5", sources), "");
  // The value as the library names it: "steps '10'" (TrainStep's
  // "precision 'amp'", which a nanoGPT file's dtype set).
  EXPECT_EQ(settings_file_note("lamp::X: steps '10' cannot run here", sources),
            " (set by " + path + " line 1 (steps = 10))");
  // guarded_main() puts the note inside the sentence.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(lamp_examples::guarded_main(
                "prog",
                []() -> int {
                  TORCH_CHECK(false, "--steps 10 is too few; give 20.");
                },
                sources),
            lamp_examples::kRuntimeError);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "prog: error: --steps 10 is too few; give 20 (set by " + path +
                " line 1 (steps = 10)).\n");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(
      lamp_examples::guarded_main(
          "prog", []() -> int { throw std::runtime_error("--steps 10 lost"); },
          sources),
      lamp_examples::kRuntimeError);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "prog: error: --steps 10 lost (set by " + path +
                " line 1 (steps = 10))\n");
}

// nanoGPT's config files as train_gpt's flags.
struct NanoGpt {
  std::map<std::string, std::string> given; // what the command line gives
  std::vector<std::string> notes;

  std::vector<lamp_examples::ConfigFlag> flags(const std::string& path) {
    const auto file = lamp_examples::read_config_file(path);
    return lamp_examples::nanogpt_config_flags(
        file,
        [this](const std::string& flag) -> const std::string* {
          const auto found = given.find(flag);
          return found == given.end() ? nullptr : &found->second;
        },
        notes);
  }
  // "--flag=value ..." for comparison.
  std::map<std::string, std::string> values(const std::string& path) {
    std::map<std::string, std::string> values;
    for (const auto& flag : flags(path)) {
      EXPECT_EQ(values.count(flag.flag), 0u) << flag.flag << " twice";
      values[flag.flag] = flag.value;
    }
    return values;
  }
};

TEST(NanoGptConfig, TheCharacterModelsRecipe) {
  const auto folder = test_folder();
  const auto out = folder + "/runs/out-shakespeare-char"; // two to make
  const auto path = write(folder + "/train_shakespeare_char.py",
                          "out_dir = '" + out +
                              "'\n"
                              "eval_interval = 250 # often\n"
                              "eval_iters = 200\n"
                              "log_interval = 10\n"
                              "always_save_checkpoint = False\n"
                              "wandb_log = False\n"
                              "wandb_project = 'shakespeare-char'\n"
                              "dataset = 'shakespeare_char'\n"
                              "gradient_accumulation_steps = 1\n"
                              "batch_size = 64\n"
                              "block_size = 256\n"
                              "n_layer = 6\nn_head = 6\nn_embd = 384\n"
                              "dropout = 0.2\n"
                              "learning_rate = 1e-3\n"
                              "max_iters = 5000\nlr_decay_iters = 5000\n"
                              "min_lr = 1e-4\nbeta2 = 0.99\n"
                              "warmup_iters = 100\n"
                              "# device = 'cpu'\n");
  NanoGpt nanogpt;
  const auto values = nanogpt.values(path);
  const std::map<std::string, std::string> expected = {
      {"--accumulation-steps", "1"},
      {"--layers", "6"},
      {"--heads", "6"},
      {"--width", "384"},
      {"--bias", "false"}, // train.py's default
      {"--context", "256"},
      {"--dropout", "0.2"},
      {"--batch-size", "64"},
      {"--data", "data/shakespeare_char"},
      {"--lr", "0.001"},
      {"--weight-decay", "0.1"}, // train.py's
      {"--beta1", "0.9"},        // train.py's
      {"--beta2", "0.99"},
      {"--max-grad-norm", "1"}, // train.py's
      {"--steps", "5000"},
      {"--schedule", "warmup-cosine"},
      {"--warmup-steps", "100"},
      {"--min-lr", "0.0001"},
      {"--eval-every", "250"},
      {"--checkpoint-every", "250"},
      {"--log-every", "10"},
      {"--eval-batches", "200"},
      {"--eval-batch-size", "64"}, // estimate_loss()'s batches
      {"--eval-only", "false"},
      {"--eval-at-start", "true"}, // nanoGPT's iteration 0
      {"--checkpoint", out + "/lamp.pt"},
      {"--precision", "auto"},
  };
  EXPECT_EQ(values, expected);
  EXPECT_TRUE(nanogpt.notes.empty());
  EXPECT_TRUE(is_directory(out)); // made, as train.py makes it
  // No evaluation at the start where the command line turns them off.
  NanoGpt no_evaluations;
  no_evaluations.given["--eval-every"] = "0";
  EXPECT_EQ(no_evaluations.values(path).count("--eval-at-start"), 0u);
  // nanoGPT evaluates batches of the batch_size it trains with, the
  // command line's where it gives one.
  NanoGpt smaller_batches;
  smaller_batches.given["--batch-size"] = "12";
  EXPECT_EQ(smaller_batches.values(path).at("--eval-batch-size"), "12");
  // A --schedule typed over decay_lr: constant takes none of the file's
  // warm-up and min_lr (which it would refuse), warmup-cosine takes them
  // where decay_lr is False.
  NanoGpt constant;
  constant.given["--schedule"] = "constant";
  const auto constant_values = constant.values(path);
  EXPECT_EQ(constant_values.count("--warmup-steps"), 0u);
  EXPECT_EQ(constant_values.count("--min-lr"), 0u);
  const auto no_decay = write(folder + "/no_decay.py",
                              "decay_lr = False\nwarmup_iters = 7\n"
                              "gradient_accumulation_steps = 1\n"
                              "min_lr = 2e-4\nmax_iters = 100\n");
  NanoGpt cosine;
  cosine.given["--schedule"] = "warmup-cosine";
  const auto cosine_values = cosine.values(no_decay);
  EXPECT_EQ(cosine_values.at("--warmup-steps"), "7");
  EXPECT_EQ(cosine_values.at("--min-lr"), "0.0002");
  EXPECT_EQ(NanoGpt().values(no_decay).count("--warmup-steps"), 0u);
  // Each flag names its line, or train.py's default.
  for (const auto& flag : nanogpt.flags(path)) {
    if (flag.flag == "--width") {
      EXPECT_EQ(flag.source, path + " line 14 (n_embd = 384)");
    }
    if (flag.flag == "--beta1") {
      EXPECT_EQ(flag.source, "nanoGPT's train.py default (beta1 = 0.9)");
    }
  }
}

TEST(NanoGptConfig, TrainPysDefaultsWhereTheFileIsSilent) {
  const auto folder = test_folder();
  ::mkdir((folder + "/data").c_str(), 0777);
  ::mkdir((folder + "/data/owt").c_str(), 0777);
  write(folder + "/data/owt/train.bin", "");
  const auto gpt2 =
      write(folder + "/gpt2.py", "out_dir = '" + folder + "/out'\ndataset = '" +
                                     folder + "/data/owt'\n");
  NanoGpt tokens;
  // Token files without a meta.pkl: GPT-2's vocabulary, padded, as
  // train.py takes it; not where --tokenizer gives one.
  EXPECT_EQ(tokens.values(gpt2).at("--vocab-size"), "50304");
  tokens.given["--tokenizer"] = "gpt2.tiktoken";
  EXPECT_EQ(tokens.values(gpt2).count("--vocab-size"), 0u);
  write(folder + "/data/owt/meta.pkl", "");
  const auto path =
      write(folder + "/c.py", "out_dir = '" + folder + "/out'\ndataset = '" +
                                  folder + "/data/owt'\n");
  NanoGpt nanogpt;
  const auto values = nanogpt.values(path);
  // GPT-2 124M on OpenWebText, 40 batches an iteration.
  EXPECT_EQ(values.at("--layers"), "12");
  EXPECT_EQ(values.at("--width"), "768");
  EXPECT_EQ(values.at("--context"), "1024");
  EXPECT_EQ(values.at("--dropout"), "0");
  EXPECT_EQ(values.at("--batch-size"), "12");
  EXPECT_EQ(values.at("--accumulation-steps"), "40");
  EXPECT_EQ(values.at("--steps"), "24000000");
  EXPECT_EQ(values.at("--warmup-steps"), "80000");
  EXPECT_EQ(values.at("--eval-every"), "80000");
  EXPECT_EQ(values.at("--log-every"), "40");
  EXPECT_EQ(values.at("--lr"), "0.0006");
  EXPECT_EQ(values.at("--min-lr"), "6e-05");
  EXPECT_EQ(values.at("--beta2"), "0.95");
  EXPECT_EQ(values.count("--vocab-size"), 0u); // meta.pkl's
  EXPECT_EQ(values.count("--device"), 0u);
}

// A first try of a config, --steps 50 against its warmup_iters = 100, is
// not refused: the warm-up keeps its share of max_iters, and a note
// says so; so does a file whose max_iters is no longer than train.py's
// default warm-up (train_gpt's 2%). A warm-up the command line gives, a run
// in --epochs, or a file that sets both itself keep the file's value (the
// program refuses the last, naming the line).
TEST(NanoGptConfig, AWarmUpLongerThanTheRunKeepsItsShare) {
  // The notes on the warm-up (lr_decay_iters has one of its own).
  const auto warmup_notes = [](const NanoGpt& n) {
    std::vector<std::string> found;
    for (const auto& note : n.notes) {
      if (note.find("(warmup_iters = ") != std::string::npos) {
        found.push_back(note);
      }
    }
    return found;
  };
  const auto folder = test_folder();
  const auto path =
      write(folder + "/c.py", "out_dir = '" + folder +
                                  "/out'\nmax_iters = 1000\nwarmup_iters = "
                                  "100\ngradient_accumulation_steps = 2\n");
  NanoGpt first_try;
  first_try.given["--steps"] = "100"; // 50 iterations of 2 batches
  EXPECT_EQ(first_try.values(path).at("--warmup-steps"), "10");
  const auto first_notes = warmup_notes(first_try);
  ASSERT_EQ(first_notes.size(), 1u);
  EXPECT_NE(first_notes[0].find(
                path + " line 3 (warmup_iters = 100) is not shorter than the "
                       "run's 100 steps: the warm-up is 10 steps instead, "
                       "10% of the run, the share of max_iters = 1000 it is "
                       "in the file; give --warmup-steps to choose."),
            std::string::npos)
      << first_notes[0];
  for (const auto& flag : first_try.flags(path)) {
    if (flag.flag == "--warmup-steps") {
      EXPECT_EQ(flag.source, path +
                                 " line 3 (warmup_iters = 100) is not shorter "
                                 "than the run's 100 steps: 10% of the run");
    }
  }
  // Shorter than the run: the file's, unchanged.
  NanoGpt longer;
  longer.given["--steps"] = "202";
  EXPECT_EQ(longer.values(path).at("--warmup-steps"), "200");
  EXPECT_TRUE(warmup_notes(longer).empty());
  // What the command line says of the warm-up, or a run in epochs: as given.
  NanoGpt typed;
  typed.given["--steps"] = "100";
  typed.given["--warmup-steps"] = "150";
  EXPECT_EQ(typed.values(path).at("--warmup-steps"), "200");
  EXPECT_TRUE(warmup_notes(typed).empty());
  NanoGpt epochs;
  epochs.given["--epochs"] = "1";
  EXPECT_EQ(epochs.values(path).at("--warmup-steps"), "200");
  EXPECT_TRUE(warmup_notes(epochs).empty());
  // max_iters = 1000 under train.py's default warmup_iters = 2000: 2% of
  // the run, 20 iterations.
  const auto short_file =
      write(folder + "/s.py", "out_dir = '" + folder +
                                  "/out'\nmax_iters = 1000\n"
                                  "gradient_accumulation_steps = 1\n");
  NanoGpt defaults;
  EXPECT_EQ(defaults.values(short_file).at("--warmup-steps"), "20");
  const auto default_notes = warmup_notes(defaults);
  ASSERT_EQ(default_notes.size(), 1u);
  EXPECT_NE(default_notes[0].find(
                "nanoGPT's train.py default (warmup_iters = 2000) is not "
                "shorter than the run's 1000 steps: the warm-up is 20 steps "
                "instead, 2% of the run, train_gpt's own share"),
            std::string::npos)
      << default_notes[0];
  // A file that sets both: its own contradiction, left for the program.
  const auto both = write(folder + "/b.py", "out_dir = '" + folder +
                                                "/out'\nmax_iters = 50\n"
                                                "warmup_iters = 100\n"
                                                "gradient_accumulation_steps = "
                                                "1\n");
  NanoGpt contradiction;
  EXPECT_EQ(contradiction.values(both).at("--warmup-steps"), "100");
  EXPECT_TRUE(warmup_notes(contradiction).empty());
}

TEST(NanoGptConfig, IterationsCountTheBatchesOfEachRank) {
  const auto folder = test_folder();
  const auto path =
      write(folder + "/c.py", "out_dir = '" + folder +
                                  "/out'\ngradient_accumulation_steps = 5 * 8\n"
                                  "max_iters = 100\nwarmup_iters = 10\n"
                                  "eval_interval = 20\nlog_interval = 1\n"
                                  "lr_decay_iters = 100\n");
  NanoGpt nanogpt;
  ::setenv("WORLD_SIZE", "4", 1);
  const auto four = nanogpt.values(path);
  ::setenv("WORLD_SIZE", "3", 1);
  const auto three = refusal([&] { nanogpt.values(path); });
  ::unsetenv("WORLD_SIZE");
  EXPECT_EQ(four.at("--accumulation-steps"), "10");
  EXPECT_EQ(four.at("--steps"), "1000");
  EXPECT_EQ(four.at("--warmup-steps"), "100");
  EXPECT_EQ(four.at("--eval-every"), "200");
  EXPECT_EQ(four.at("--log-every"), "10");
  EXPECT_HAS(three, "does not divide among WORLD_SIZE=3 ranks");
  // The command line's --accumulation-steps (per rank) counts instead.
  nanogpt.given["--accumulation-steps"] = "2";
  const auto typed = nanogpt.values(path);
  EXPECT_EQ(typed.count("--accumulation-steps"), 0u);
  EXPECT_EQ(typed.at("--steps"), "200");
  EXPECT_TRUE(nanogpt.notes.empty());
  // A --steps of the command line's: the cosine spans it, said in a note.
  nanogpt.given["--steps"] = "50";
  nanogpt.values(path);
  ASSERT_EQ(nanogpt.notes.size(), 1u);
  EXPECT_HAS(nanogpt.notes[0],
             "lamp's cosine decays to min_lr over the run's "
             "steps");
}

TEST(NanoGptConfig, ScheduleStartPrecisionAndSampling) {
  const auto folder = test_folder();
  const auto out = folder + "/out";
  const auto path = folder + "/c.py";
  NanoGpt nanogpt;
  // decay_lr = False: a constant rate, no warm-up.
  write(path, "out_dir = '" + out +
                  "'\ndecay_lr = False\ndtype = 'float16'\n"
                  "device = 'cpu'\nstart = 'FILE:prompt.txt'\n"
                  "max_new_tokens = 100\ntop_k = 200\nseed = 1337\n"
                  "wandb_log = True\n");
  auto values = nanogpt.values(path);
  EXPECT_EQ(values.at("--schedule"), "constant");
  EXPECT_EQ(values.count("--warmup-steps"), 0u);
  EXPECT_EQ(values.count("--min-lr"), 0u);
  EXPECT_EQ(values.at("--precision"), "amp");
  EXPECT_EQ(values.at("--device"), "cpu");
  EXPECT_EQ(values.at("--prompt-file"), "prompt.txt");
  EXPECT_EQ(values.at("--sample-tokens"), "100");
  EXPECT_EQ(values.at("--top-k"), "200");
  EXPECT_EQ(values.at("--seed"), "1337");
  ASSERT_EQ(nanogpt.notes.size(), 1u);
  EXPECT_HAS(nanogpt.notes[0],
             "(wandb_log = True): train_gpt does not log to "
             "Weights & Biases");
  // --eval-only (the file's or the command line's) and --sample-only write
  // no checkpoint, and make no out_dir.
  for (const auto& mode : {"file", "--eval-only", "--sample-only"}) {
    SCOPED_TRACE(mode);
    NanoGpt quiet;
    const auto elsewhere = folder + "/elsewhere";
    write(path, "out_dir = '" + elsewhere + "'\n" +
                    (std::string(mode) == "file" ? "eval_only = True\n" : ""));
    if (std::string(mode) != "file") {
      quiet.given[mode] = "";
    }
    const auto read = quiet.values(path);
    EXPECT_EQ(read.count("--checkpoint"), 0u);
    EXPECT_EQ(read.count("--checkpoint-every"), 0u);
    EXPECT_EQ(read.count("--eval-at-start"), 0u);
    EXPECT_FALSE(exists(elsewhere));
    if (std::string(mode) != "--sample-only") {
      EXPECT_EQ(read.at("--eval-only"),
                std::string(mode) == "file" ? "true" : "false");
      continue;
    }
    // --sample-only reads the file as sample.py: init_from = 'resume' where
    // it sets none, the checkpoint's data (the file sets no dataset), and
    // none of train.py's training settings.
    EXPECT_EQ(read.at("--resume"), elsewhere + "/lamp.pt");
    for (const auto* flag :
         {"--eval-only", "--data", "--steps", "--batch-size", "--lr",
          "--layers", "--accumulation-steps", "--schedule"}) {
      EXPECT_EQ(read.count(flag), 0u) << flag;
    }
  }
  // --sample-only=false: the file's run, as without the flag.
  {
    NanoGpt training;
    training.given["--sample-only"] = "false";
    write(path, "out_dir = '" + folder + "/trains'\n");
    const auto read = training.values(path);
    EXPECT_EQ(read.count("--resume"), 0u);
    EXPECT_EQ(read.at("--checkpoint"), folder + "/trains/lamp.pt");
    EXPECT_EQ(read.at("--layers"), "12");
  }
  // --sample-only with a file that sets init_from and dataset: those, as
  // sample.py takes them.
  {
    NanoGpt sampling;
    sampling.given["--sample-only"] = "";
    write(path, "init_from = 'scratch'\ndataset = 'chars'\n");
    const auto read = sampling.values(path);
    EXPECT_EQ(read.count("--resume"), 0u);
    EXPECT_EQ(read.at("--data"), "data/chars");
  }
  // init_from = 'resume': lamp's checkpoint in out_dir, with its shape.
  write(path, "out_dir = '" + out + "'\ninit_from = 'resume'\nn_layer = 2\n");
  values = nanogpt.values(path);
  EXPECT_EQ(values.at("--resume"), out + "/lamp.pt");
  EXPECT_EQ(values.count("--layers"), 0u);
  EXPECT_EQ(values.count("--context"), 0u);
  // Only nanoGPT's own ckpt.pt there: no run of lamp's to continue; its
  // weights start one.
  write(out + "/ckpt.pt", "");
  EXPECT_HAS(refusal([&] { nanogpt.values(path); }),
             "c.py line 2 (init_from = 'resume'): there is no lamp "
             "checkpoint " +
                 out + "/lamp.pt to resume; " + out +
                 "/ckpt.pt is nanoGPT's own, which train_gpt does not "
                 "continue (its optimizer state and iteration are PyTorch's). "
                 "Give --init-from " +
                 out + "/ckpt.pt to start from its weights");
  NanoGpt from_weights;
  from_weights.given["--init-from"] = out + "/ckpt.pt";
  EXPECT_EQ(from_weights.values(path).count("--resume"), 0u);
  ::remove((out + "/ckpt.pt").c_str());
  // init_from = 'gpt2-medium': GPT-2's shape, given --init-from's weights.
  write(path, "out_dir = '" + out +
                  "'\ninit_from = 'gpt2-medium'\nblock_size = 256\n");
  EXPECT_HAS(refusal([&] { nanogpt.values(path); }),
             "train_gpt downloads nothing: give --init-from");
  nanogpt.given["--init-from"] = "gpt2-medium.safetensors";
  values = nanogpt.values(path);
  EXPECT_EQ(values.at("--layers"), "24");
  EXPECT_EQ(values.at("--heads"), "16");
  EXPECT_EQ(values.at("--width"), "1024");
  EXPECT_EQ(values.at("--bias"), "true");
  EXPECT_EQ(values.at("--context"), "256"); // cropped, as train.py crops
  EXPECT_EQ(values.count("--vocab-size"), 0u);
  // The fine-tuning run continued: its checkpoint holds the weights and the
  // shape, so neither --init-from nor GPT-2's shape flags.
  NanoGpt continued;
  continued.given["--resume"] = out + "/lamp.pt";
  values = continued.values(path);
  EXPECT_EQ(values.count("--layers"), 0u);
  EXPECT_EQ(values.count("--bias"), 0u);
  EXPECT_EQ(values.at("--context"), "256");
}

TEST(NanoGptConfig, RefusesWhatNanoGptDoesNotHave) {
  const auto folder = test_folder();
  const auto path = folder + "/c.py";
  NanoGpt nanogpt;
  const auto refused = [&](const std::string& text) {
    write(path, "out_dir = '" + folder + "/out'\n" + text);
    return refusal([&] { nanogpt.flags(path); });
  };
  EXPECT_HAS(refused("n_layers = 4\n"),
             "c.py line 2 (n_layers = 4): nanoGPT's train.py and sample.py "
             "have no setting n_layers; did you mean n_layer?");
  EXPECT_HAS(refused("dtype = 'float64'\n"),
             "dtype is 'float32', 'bfloat16' or 'float16'");
  EXPECT_HAS(refused("init_from = 'gpt3'\n"), "init_from is 'scratch'");
  EXPECT_HAS(refused("max_iters = 2.5\n"),
             "max_iters must be a whole number of at least 1");
  EXPECT_HAS(refused("bias = 'yes'\n"), "bias must be True or False");
  EXPECT_HAS(refused("n_layer = N_LAYER\n"),
             "(n_layer = N_LAYER): train_gpt reads numbers");
  EXPECT_HAS(refused("eval_iters = None\n"),
             "(eval_iters = None): train_gpt reads numbers");
  // A damaged line is quoted in part, not whole.
  const auto deep = refused("n_layer = " + std::string(100000, '(') + "1" +
                            std::string(100000, ')') + "\n");
  EXPECT_HAS(deep, "(n_layer = (((");
  EXPECT_HAS(deep, "...): train_gpt reads numbers");
  EXPECT_LT(deep.size(), 400u) << deep.size();
  // Counts beyond lamp's 64-bit steps: each is exact (below 2^53), their
  // product is not.
  EXPECT_HAS(refused("gradient_accumulation_steps = 2**20\n"
                     "max_iters = 2**50\n"),
             "max_iters = 1125899906842624 iterations of 1048576 batches "
             "each is more steps than lamp counts (2^63 - 1): give a smaller "
             "max_iters.");
  EXPECT_HAS(refused("gradient_accumulation_steps = 2**20\n"
                     "max_iters = 1000\nwarmup_iters = 2**50\n"),
             "warmup_iters = 1125899906842624 iterations of 1048576 batches");
  EXPECT_HAS(refused("gradient_accumulation_steps = 2**20\n"
                     "eval_interval = 2**50\n"),
             "eval_interval = 1125899906842624 iterations of 1048576");
  // An expression left unevaluated is refused only where it is used.
  write(path, "out_dir = '" + folder +
                  "/out'\nimport time\nwandb_run_name = 'r' + "
                  "str(time.time())\n");
  EXPECT_NO_THROW(nanogpt.flags(path));
}

} // namespace
