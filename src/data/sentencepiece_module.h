#pragma once

// The interface between lamp and its SentencePiece module
// (liblamp_sentencepiece.so, src/data/sentencepiece_module.cpp), internal.
//
// Why a module: Debian's libsentencepiece.so.0 carries its own copy of
// protobuf-lite and exports its symbols. Linked into a program beside
// Debian's LibTorch, which loads libprotobuf.so.32, the program crashes
// before main(): libprotobuf's static initialisers bind to
// libsentencepiece's copies of its functions (measured: a segmentation fault
// in ReflectionOps::FindInitializationErrors, called from libsentencepiece's
// MergeFromImpl). So lamp never links libsentencepiece: it opens the module,
// which does, with dlopen(RTLD_LOCAL | RTLD_DEEPBIND) on first use; the
// module and libsentencepiece then bind to their own protobuf, and nothing
// of theirs enters the program's global symbol scope.
//
// The module's functions never throw: they report errors as text. Only the
// C++ standard library's types cross the boundary (one libstdc++ serves
// both sides), and the objects are used through virtual calls, which need
// no symbol lookup.

#include <string>
#include <utility>
#include <vector>

namespace lamp {
namespace data {
namespace detail {

// One loaded SentencePiece model (a SentencePieceProcessor).
class SentencePieceModel {
 public:
  virtual ~SentencePieceModel() = default;
  virtual int size() const = 0;
  virtual bool is_byte(int id) const = 0;
  // The end-of-sentence piece's id (`</s>`), or -1 where the model has none.
  virtual int eos_id() const = 0;
  // false and `error` set on failure.
  virtual bool encode(const std::string& text, std::vector<int>* ids,
                      std::string* error) const = 0;
  virtual bool decode(const std::vector<int>& ids, std::string* text,
                      std::string* error) const = 0;
  virtual std::string serialized() const = 0;
};

// The module's entry points; `version` must be kSentencePieceModuleVersion.
struct SentencePieceModule {
  int version;
  // The model of the serialized ModelProto `bytes`; nullptr and `error` set
  // when it is not one. The caller deletes it.
  SentencePieceModel* (*load)(const std::string& bytes, std::string* error);
  // SentencePieceTrainer::Train with `arguments` (its flags by name, without
  // the dashes) on the lines of `text` (empty lines left out, lines longer
  // than `max_line_bytes` cut at a character boundary); the serialized model
  // into `model`. false and `error` set on failure.
  bool (*train)(
      const std::string& text,
      const std::vector<std::pair<std::string, std::string>>& arguments,
      size_t max_line_bytes, std::string* model, std::string* error);
};

constexpr int kSentencePieceModuleVersion = 2;

// The one exported symbol of the module.
constexpr const char* kSentencePieceModuleEntry = "lamp_sentencepiece_module";

} // namespace detail
} // namespace data
} // namespace lamp
