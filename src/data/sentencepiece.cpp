#include "lamp/data/sentencepiece.h"

#include <dlfcn.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "data/files.h"
#include "data/sentencepiece_module.h"
#include "data/token_ids.h"
#include "lamp/data/tokenizer.h"
#include "lamp/platform/checkpoint_file.h"
#include "platform/checkpoint_io.h"

namespace lamp {
namespace data {
namespace {

using internal::quoted;

// SentencePiece's trainer skips longer lines; train_sentencepiece() cuts
// them to this instead (the module's TextLines), and passes it as the
// trainer's max_sentence_length.
constexpr size_t kMaxSentenceBytes = 16384;

} // namespace

int64_t text_split_point(const torch::Tensor& bytes,
                         double validation_fraction) {
  TORCH_CHECK(validation_fraction > 0 && validation_fraction < 1,
              "lamp::data::text_split_point: validation_fraction must be in "
              "(0, 1), got ",
              validation_fraction, ".");
  TORCH_CHECK(bytes.dim() == 1 && bytes.scalar_type() == torch::kUInt8,
              "lamp::data::text_split_point: bytes must be uint8 [n], got ",
              bytes.scalar_type(), " ", bytes.sizes(), ".");
  const int64_t n = bytes.size(0);
  const int64_t split = internal::text_split_byte(n, validation_fraction);
  const auto cpu = bytes.cpu().contiguous();
  return internal::split_at_character(split, cpu.data_ptr<uint8_t>() + split,
                                      static_cast<size_t>(n - split));
}

TextData tokenized_text_windows(const torch::Tensor& bytes,
                                const std::string& path,
                                const SentencePiece& tokenizer, int64_t context,
                                double validation_fraction) {
  return tokenized_text_windows(bytes, path, Tokenizer(tokenizer), context,
                                validation_fraction);
}

struct SentencePiece::Impl {
  std::unique_ptr<const detail::SentencePieceModel> model;
  std::string origin;
};

namespace {

// The module loaded, or why it could not be.
struct LoadedModule {
  const detail::SentencePieceModule* module = nullptr;
  std::string error;
};

// Where the module is when lamp was installed under some prefix P, from
// `relative` (its path under P, e.g. "lib/lamp/liblamp_sentencepiece.so"):
// P/bin/../<relative> beside a program (this process's executable, which a
// static lamp is part of), and <folder>/lamp/<name> beside a shared
// liblamp in P/<libdir>. Empty where `relative` is.
std::vector<std::string> installed_beside_lamp(const std::string& relative) {
  std::vector<std::string> found;
  if (relative.empty()) {
    return found;
  }
  const auto name = relative.substr(relative.rfind('/') + 1);
  std::vector<std::string> folders;
  // An object of lamp's: dladdr() names the file it was loaded from.
  static const char in_lamp = 0;
  Dl_info info{};
  if (::dladdr(&in_lamp, &info) != 0 && info.dli_fname != nullptr &&
      info.dli_fname[0] == '/') {
    folders.push_back(lamp::detail::parent_folder(info.dli_fname));
  }
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    folders.push_back(lamp::detail::parent_folder(exe));
  }
  for (const auto& folder : folders) {
    for (const auto& path :
         {folder + "/lamp/" + name, folder + "/../" + relative}) {
      if (std::find(found.begin(), found.end(), path) == found.end()) {
        found.push_back(path);
      }
    }
  }
  return found;
}

LoadedModule open_module() {
  LoadedModule loaded;
  if (!LAMP_WITH_SENTENCEPIECE) {
    loaded.error =
        "this lamp was built without SentencePiece; install it (apt-get "
        "install libsentencepiece-dev pkg-config) and build lamp again "
        "(CMake's LAMP_WITH_SENTENCEPIECE=AUTO finds it).";
    return loaded;
  }
  // LAMP_SENTENCEPIECE_MODULE where set; else the module installed beside
  // this lamp, wherever its prefix went; else where this configure would
  // install it, else the one of the build tree lamp was built in.
  std::vector<std::string> candidates;
  if (const char* path = std::getenv("LAMP_SENTENCEPIECE_MODULE")) {
    candidates.emplace_back(path);
  } else {
    candidates = installed_beside_lamp(LAMP_SENTENCEPIECE_MODULE_RELATIVE);
    candidates.emplace_back(LAMP_SENTENCEPIECE_MODULE_INSTALLED);
    candidates.emplace_back(LAMP_SENTENCEPIECE_MODULE_BUILT);
  }
  std::string tried;
  for (const auto& path : candidates) {
    if (path.empty()) {
      continue;
    }
    if (!internal::regular_file_exists(path)) {
      tried += (tried.empty() ? "" : "; ") + quoted(path) + " does not exist";
      continue;
    }
    // Its own symbols first (RTLD_DEEPBIND), none of them global
    // (RTLD_LOCAL): see sentencepiece_module.h.
    void* handle =
        ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      tried += (tried.empty() ? "" : "; ") + quoted(path) + ": " +
               (why != nullptr ? why : "dlopen failed");
      continue;
    }
    using Entry = const detail::SentencePieceModule* (*)();
    auto entry = reinterpret_cast<Entry>(
        ::dlsym(handle, detail::kSentencePieceModuleEntry));
    const auto* module = entry != nullptr ? entry() : nullptr;
    if (module == nullptr ||
        module->version != detail::kSentencePieceModuleVersion) {
      tried += (tried.empty() ? "" : "; ") + quoted(path) +
               " is another lamp's module (another version)";
      continue;
    }
    loaded.module = module; // never closed: models may outlive any owner
    return loaded;
  }
  loaded.error =
      "lamp's SentencePiece module (liblamp_sentencepiece.so) "
      "could not be loaded: " +
      tried +
      ". Install lamp again (the liblamp-dev package holds it), "
      "or point LAMP_SENTENCEPIECE_MODULE at the module.";
  return loaded;
}

const detail::SentencePieceModule& module(const char* caller) {
  static const LoadedModule loaded = open_module();
  TORCH_CHECK(loaded.module != nullptr, caller, ": ", loaded.error);
  return *loaded.module;
}

} // namespace

bool sentencepiece_available() {
  return LAMP_WITH_SENTENCEPIECE != 0;
}

SentencePiece SentencePiece::from_serialized(const std::string& bytes,
                                             const std::string& origin) {
  const char* caller = "lamp::data::SentencePiece";
  const auto& api = module(caller);
  TORCH_CHECK(!bytes.empty(), caller, ": ", quoted(origin),
              " is empty; give a SentencePiece model (the .model file "
              "spm_train writes).");
  std::string error;
  std::unique_ptr<const detail::SentencePieceModel> model(
      api.load(bytes, &error));
  TORCH_CHECK(model != nullptr, caller, ": ", quoted(origin),
              " is not a SentencePiece model, or a damaged one (SentencePiece "
              "says: ",
              error,
              "); give the .model file spm_train or Python's sentencepiece "
              "wrote (not the .vocab beside it).");
  auto impl = std::make_shared<Impl>();
  impl->model = std::move(model);
  impl->origin = origin;
  return SentencePiece(std::move(impl));
}

SentencePiece SentencePiece::load(const std::string& path) {
  const char* caller = "lamp::data::SentencePiece::load";
  module(caller);
  TORCH_CHECK(!path.empty(), caller,
              ": the path is empty; give a SentencePiece model file.");
  const auto kind = internal::path_kind(path);
  TORCH_CHECK(kind != internal::PathKind::kMissing, caller, ": ", quoted(path),
              " does not exist; give a SentencePiece model (the .model file "
              "spm_train writes).");
  TORCH_CHECK(kind == internal::PathKind::kFile, caller, ": ", quoted(path),
              " is not a regular file; give a SentencePiece model (the "
              ".model file spm_train writes).");
  return from_serialized(::lamp::detail::read_regular_file(path), path);
}

void SentencePiece::save(const std::string& path) const {
  write_file_atomically(path, serialized());
}

const detail::SentencePieceModel& SentencePiece::model() const {
  TORCH_CHECK(!empty(), "lamp::data::SentencePiece: no model loaded.");
  return *impl_->model;
}

int64_t SentencePiece::vocab_size() const {
  return model().size();
}

const std::string& SentencePiece::origin() const {
  model();
  return impl_->origin;
}

std::string SentencePiece::describe() const {
  const auto& m = model();
  int64_t bytes = 0;
  for (int id = 0; id < m.size(); ++id) {
    bytes += m.is_byte(id) ? 1 : 0;
  }
  std::string text = std::to_string(m.size()) + " pieces";
  if (bytes > 0) {
    text += ", " + std::to_string(bytes) + " of them bytes (byte fallback)";
  }
  return text;
}

int64_t SentencePiece::end_of_text_id() const {
  const int id = model().eos_id();
  return id >= 0 && id < model().size() ? id : -1;
}

torch::Tensor SentencePiece::encode(const std::string& text) const {
  std::vector<int> ids;
  std::string error;
  TORCH_CHECK(model().encode(text, &ids, &error),
              "lamp::data::SentencePiece::encode: ", quoted(impl_->origin),
              " failed on a text of ", text.size(), " bytes: ", error);
  return internal::token_ids_tensor(ids);
}

std::string SentencePiece::decode(const torch::Tensor& ids) const {
  const auto& m = model();
  const auto values =
      internal::token_ids_on_cpu(ids, "lamp::data::SentencePiece::decode");
  const auto* p = values.data_ptr<int64_t>();
  const int64_t size = m.size();
  std::string text;
  std::vector<int> run; // ids the model knows, decoded together
  const auto flush = [&] {
    if (run.empty()) {
      return;
    }
    std::string piece, error;
    TORCH_CHECK(m.decode(run, &piece, &error),
                "lamp::data::SentencePiece::decode: ", quoted(impl_->origin),
                " failed: ", error);
    text += piece;
    run.clear();
  };
  for (int64_t i = 0; i < values.size(0); ++i) {
    if (p[i] >= 0 && p[i] < size) {
      run.push_back(static_cast<int>(p[i]));
    } else {
      flush();
      // Piece by piece, as in BytePairEncoding::decode.
      text += '<';
      text += std::to_string(p[i]);
      text += '>';
    }
  }
  flush();
  return text;
}

std::string SentencePiece::serialized() const {
  return model().serialized();
}

SentencePiece train_sentencepiece(const std::string& text,
                                  const SentencePieceTrainOptions& options,
                                  const std::string& origin) {
  const char* caller = "lamp::data::train_sentencepiece";
  const auto& api = module(caller);
  TORCH_CHECK(text.find_first_not_of('\n') != std::string::npos, caller, ": ",
              origin,
              " is empty (no line with text); give a text to train "
              "the tokenizer on.");
  TORCH_CHECK(
      options.model_type() == "bpe" || options.model_type() == "unigram",
      caller, ": model_type must be \"bpe\" or \"unigram\", got \"",
      options.model_type(), "\".");
  TORCH_CHECK(
      options.character_coverage() > 0 && options.character_coverage() <= 1,
      caller, ": character_coverage must be in (0, 1], got ",
      options.character_coverage(), ".");
  TORCH_CHECK(options.threads() >= 1, caller, ": threads must be >= 1, got ",
              options.threads(), ".");
  // <unk>, <s>, </s>, and with byte fallback the 256 bytes.
  const int64_t smallest = 3 + (options.byte_fallback() ? 256 : 0) + 1;
  TORCH_CHECK(options.vocab_size() >= smallest &&
                  options.vocab_size() <= (int64_t{1} << 30),
              caller, ": vocab_size ", options.vocab_size(),
              " is out of range; give at least ", smallest,
              " (the control pieces",
              options.byte_fallback() ? ", the 256 byte pieces" : "",
              " and one more).");
  const std::vector<std::pair<std::string, std::string>> arguments = {
      {"model_type", options.model_type()},
      {"vocab_size", std::to_string(options.vocab_size())},
      {"character_coverage", std::to_string(options.character_coverage())},
      {"byte_fallback", options.byte_fallback() ? "true" : "false"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"num_threads", std::to_string(options.threads())},
      // Its progress lines are not lamp's to print; errors come back as
      // the status.
      {"minloglevel", "2"}};
  std::string serialized, error;
  if (!api.train(text, arguments, kMaxSentenceBytes, &serialized, &error)) {
    // SentencePiece's bounds, in lamp's words: its status quotes a source
    // line and an option lamp does not have.
    std::smatch m;
    static const std::regex too_few(
        R"(smaller than required_chars\. (\d+) vs (\d+))");
    static const std::regex too_many(R"(set it to a value <= (\d+))");
    if (std::regex_search(error, m, too_few)) {
      TORCH_CHECK(
          false, caller, ": ", options.vocab_size(), " pieces are too few for ",
          origin, " (", text.size(), " bytes): its characters",
          options.byte_fallback() ? " and the 256 byte pieces" : "", " need ",
          m[2].str(), " at least. Give a vocabulary of at least ", m[2].str(),
          " pieces.");
    }
    if (std::regex_search(error, m, too_many)) {
      TORCH_CHECK(false, caller, ": ", options.vocab_size(),
                  " pieces are more than ", origin, " (", text.size(),
                  " bytes) holds: at most ", m[1].str(),
                  ". Give a vocabulary of at most ", m[1].str(),
                  " pieces, or a longer text.");
    }
    TORCH_CHECK(false, caller, ": SentencePiece could not train a model of ",
                options.vocab_size(), " pieces on ", origin, " (", text.size(),
                " bytes): ", error,
                ". Give another vocabulary size, or a longer text.");
  }
  return SentencePiece::from_serialized(serialized,
                                        "a model trained from " + origin);
}

} // namespace data
} // namespace lamp
