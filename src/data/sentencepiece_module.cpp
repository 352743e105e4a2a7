// liblamp_sentencepiece.so: lamp's SentencePiece module, the one part of
// lamp that links libsentencepiece (src/data/sentencepiece_module.h says
// why). Built only where SentencePiece is found.
#include "data/sentencepiece_module.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lamp {
namespace data {
namespace detail {
namespace {

bool utf8_continuation(unsigned char byte) {
  return (byte & 0xC0) == 0x80;
}

// The text of the exception being handled.
std::string current_error() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// Runs `body` (returning a SentencePiece status): true when it succeeds,
// else false with the status's or the exception's text in `error`.
template <typename Body>
bool guarded(std::string* error, Body body) {
  try {
    const sentencepiece::util::Status status = body();
    if (!status.ok()) {
      *error = status.ToString();
    }
    return status.ok();
  } catch (...) {
    *error = current_error();
    return false;
  }
}

class Model final : public SentencePieceModel {
 public:
  sentencepiece::SentencePieceProcessor processor;

  int size() const override { return processor.GetPieceSize(); }
  bool is_byte(int id) const override { return processor.IsByte(id); }
  int eos_id() const override { return processor.eos_id(); }
  bool encode(const std::string& text, std::vector<int>* ids,
              std::string* error) const override {
    return guarded(error, [&] { return processor.Encode(text, ids); });
  }
  bool decode(const std::vector<int>& ids, std::string* text,
              std::string* error) const override {
    return guarded(error, [&] { return processor.Decode(ids, text); });
  }
  std::string serialized() const override {
    return processor.serialized_model_proto();
  }
};

// The lines of a text, for SentencePiece's trainer: empty lines left out,
// long lines cut at a character boundary (the trainer would skip them).
class TextLines final : public sentencepiece::SentenceIterator {
 public:
  TextLines(const std::string& text, size_t max_bytes)
      : text_(text), max_bytes_(max_bytes) {
    Next();
  }
  bool done() const override { return done_; }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }
  void Next() override {
    while (position_ < text_.size()) {
      const size_t newline = text_.find('\n', position_);
      const size_t end = newline == std::string::npos ? text_.size() : newline;
      size_t cut = end - position_ > max_bytes_ ? position_ + max_bytes_ : end;
      while (cut < end && cut > position_ &&
             utf8_continuation(static_cast<unsigned char>(text_[cut]))) {
        --cut;
      }
      if (cut == position_ && cut < end) {
        // No character starts in the line's first max_bytes_ (bytes that
        // are not UTF-8): cut there anyway, or the line would never move.
        cut = position_ + max_bytes_;
      }
      line_.assign(text_, position_, cut - position_);
      position_ = cut == end ? end + 1 : cut;
      if (!line_.empty()) {
        return;
      }
    }
    done_ = true;
  }

 private:
  const std::string& text_;
  size_t max_bytes_;
  size_t position_ = 0;
  std::string line_;
  bool done_ = false;
};

SentencePieceModel* load(const std::string& bytes, std::string* error) {
  std::unique_ptr<Model> model;
  const bool loaded = guarded(error, [&] {
    model = std::make_unique<Model>();
    return model->processor.LoadFromSerializedProto(bytes);
  });
  return loaded ? model.release() : nullptr;
}

bool train(const std::string& text,
           const std::vector<std::pair<std::string, std::string>>& arguments,
           size_t max_line_bytes, std::string* model, std::string* error) {
  return guarded(error, [&] {
    const std::unordered_map<std::string, std::string> kwargs(arguments.begin(),
                                                              arguments.end());
    TextLines lines(text, max_line_bytes);
    return sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, model);
  });
}

const SentencePieceModule kModule = {kSentencePieceModuleVersion, &load,
                                     &train};

} // namespace
} // namespace detail
} // namespace data
} // namespace lamp

extern "C" __attribute__((visibility("default")))
const lamp::data::detail::SentencePieceModule*
lamp_sentencepiece_module() {
  return &lamp::data::detail::kModule;
}
