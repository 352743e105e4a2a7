#include "lamp/data/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "data/files.h"
#include "platform/plain_pickle.h"

namespace lamp {
namespace data {
namespace {

using internal::quoted;

// Ids checked per pass of the vocabulary check: 64 MiB of int32 at a time.
constexpr int64_t kCheckChunk = int64_t{1} << 24;

std::string width_name(int64_t id_bytes) {
  return id_bytes == 2 ? "uint16" : "uint32";
}

// Throws, naming `path`, the id and its position, when an id of `ids`
// (map_token_file()'s tensor) is at or above `vocab_size`. One pass, in
// chunks, so that a file of billions of ids needs no copy of itself. A
// uint16 file's ids are read unsigned whatever the vocabulary, so that the
// message gives the id as written.
void check_ids(const torch::Tensor& ids, int64_t vocab_size,
               const std::string& path, const std::string& meta_note) {
  const int64_t n = ids.size(0);
  for (int64_t start = 0; start < n; start += kCheckChunk) {
    const auto chunk = ids.slice(0, start, std::min(n, start + kCheckChunk));
    // uint16 ids in int16: flipping the sign bit orders them as unsigned,
    // so the largest id is found without widening.
    const bool fits =
        chunk.scalar_type() == torch::kShort
            ? chunk.bitwise_xor(-32768).max().item<int64_t>() + 32768 <
                  vocab_size
            : chunk.max().item<int64_t>() < vocab_size &&
                  chunk.min().item<int64_t>() >= 0;
    if (fits) {
      continue;
    }
    auto wide = widen_token_ids(chunk, /*unsigned_ids=*/true);
    if (chunk.scalar_type() == torch::kInt) {
      wide.bitwise_and_(int64_t{0xFFFFFFFF}); // uint32 ids of 2^31 and up
    }
    const auto bad = (wide.ge(vocab_size) | wide.lt(0)).nonzero();
    const int64_t at = bad[0][0].item<int64_t>();
    const int64_t id = wide[at].item<int64_t>();
    TORCH_CHECK(false, "lamp::data::read_token_files: ", quoted(path),
                " holds the id ", id, " at token ", start + at,
                ", not below the vocabulary's ", vocab_size, meta_note,
                "; give the vocabulary the data was tokenized with "
                "(meta.pkl's vocab_size, or --vocab-size), or prepare the "
                "file again.");
  }
}

// Cuts a mapped file into windows of `context`: views, not copies.
Dataset windows_of(const torch::Tensor& ids, int64_t context,
                   bool unsigned_ids) {
  const int64_t windows = (ids.size(0) - 1) / context;
  Dataset data;
  data.inputs = ids.slice(0, 0, windows * context).view({windows, context});
  data.targets =
      ids.slice(0, 1, windows * context + 1).view({windows, context});
  data.unsigned_ids = unsigned_ids;
  return data;
}

} // namespace

bool is_token_folder(const std::string& path) {
  return internal::directory_exists(path) &&
         internal::regular_file_exists(internal::join_path(path, "train.bin"));
}

int64_t token_id_bytes(int64_t vocab_size) {
  TORCH_CHECK(vocab_size >= 1 && vocab_size <= 2147483647LL,
              "lamp::data::token_id_bytes: vocab_size must be in [1, 2^31 - "
              "1], got ",
              vocab_size, ".");
  return vocab_size <= 65536 ? 2 : 4;
}

torch::Tensor map_token_file(const std::string& path, int64_t id_bytes) {
  const char* caller = "lamp::data::map_token_file";
  TORCH_CHECK(id_bytes == 2 || id_bytes == 4, caller,
              ": id_bytes must be 2 (uint16) or 4 (uint32), got ", id_bytes,
              ".");
  const uint64_t size = internal::regular_file_size(path, caller);
  TORCH_CHECK(size > 0, caller, ": ", quoted(path),
              " is empty; prepare the data again (nanoGPT's prepare.py "
              "writes train.bin and val.bin of at least one window each).");
  TORCH_CHECK(size % static_cast<uint64_t>(id_bytes) == 0, caller, ": ",
              quoted(path), " holds ", internal::byte_count(size),
              ", not a whole number of ", id_bytes, "-byte ",
              width_name(id_bytes),
              " ids: a truncated file, or ids of the "
              "other width (",
              width_name(id_bytes == 2 ? 4 : 2),
              "). Prepare the file again, or give the vocabulary it was "
              "made for (uint16 up to 65,536 ids, uint32 above).");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, caller, ": cannot open ", quoted(path), ": ",
              std::strerror(errno), "; check its permissions.");
  // Private and writable: a stray in-place operation changes a private
  // copy of its pages, never the file, and never faults. MAP_NORESERVE:
  // Linux counts a private writable mapping in full against the memory it
  // may commit, so without it a file larger than RAM and swap (OpenWebText's
  // 18 GB on a 16 GB machine) is refused, though its pages are the file's.
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  int map_errno = errno;
  bool read_only = false;
  if (base == MAP_FAILED && map_errno == ENOMEM) {
    // Strict overcommit (vm.overcommit_memory = 2) ignores MAP_NORESERVE; a
    // read-only mapping commits nothing. The tensor's users only read it.
    base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    map_errno = errno;
    read_only = base != MAP_FAILED;
  }
  ::close(fd); // the mapping keeps the file
  TORCH_CHECK(base != MAP_FAILED, caller, ": cannot map ", quoted(path), " (",
              internal::byte_count(size),
              ") into memory: ", std::strerror(map_errno),
              "; check the address-space limit (ulimit -v).");
  if (read_only) {
    TORCH_WARN_ONCE(caller, ": ", quoted(path),
                    " is mapped read-only (this system's strict overcommit "
                    "would not commit a writable copy of ",
                    internal::byte_count(size),
                    "): an in-place operation on its ids would fault.");
  }
  const auto numel = static_cast<int64_t>(size / id_bytes);
  return torch::from_blob(
      base, {numel}, [size](void* p) { ::munmap(p, size); },
      torch::TensorOptions().dtype(id_bytes == 2 ? torch::kShort
                                                 : torch::kInt));
}

torch::Tensor widen_token_ids(const torch::Tensor& ids, bool unsigned_ids) {
  auto wide = ids.to(torch::kLong);
  if (unsigned_ids && ids.scalar_type() == torch::kShort) {
    wide.bitwise_and_(0xFFFF);
  }
  return wide;
}

std::string TokenPieces::decode(const torch::Tensor& ids) const {
  const auto cpu = ids.to(torch::kLong).cpu().contiguous();
  const auto* p = cpu.data_ptr<int64_t>();
  std::string text;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    if (p[i] >= 0 && p[i] < static_cast<int64_t>(pieces.size()) &&
        !pieces[p[i]].empty()) {
      text += pieces[p[i]];
    } else {
      // Piece by piece, as in BytePairEncoding::decode.
      text += '<';
      text += std::to_string(p[i]);
      text += '>';
    }
  }
  return text;
}

torch::Tensor TokenPieces::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (size_t at = 0; at < text.size();) {
    int64_t best = -1;
    size_t best_length = 0;
    for (size_t id = 0; id < pieces.size(); ++id) {
      const auto& piece = pieces[id];
      if (piece.size() > best_length &&
          text.compare(at, piece.size(), piece) == 0) {
        best = static_cast<int64_t>(id);
        best_length = piece.size();
      }
    }
    if (best < 0) {
      // The whole UTF-8 character, for the message.
      size_t length = 1;
      while (at + length < text.size() &&
             (static_cast<unsigned char>(text[at + length]) & 0xC0) == 0x80) {
        ++length;
      }
      TORCH_CHECK(false, "lamp::data::TokenPieces::encode: the text's '",
                  text.substr(at, length), "' at byte ", at,
                  " is in no piece of the vocabulary (", pieces.size(),
                  " pieces); give text made of the data's own characters.");
    }
    ids.push_back(best);
    at += best_length;
  }
  return torch::tensor(ids, torch::kLong);
}

int64_t read_token_meta(const std::string& meta_path, TokenPieces* pieces) {
  const char* caller = "lamp::data::read_token_meta";
  const auto bytes = internal::read_small_file(meta_path, caller);
  c10::optional<c10::IValue> value;
  try {
    value =
        lamp::detail::read_plain_pickle(bytes.data(), bytes.size(), meta_path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, caller, ": ", quoted(meta_path),
                " is not a readable pickle (", e.msg(),
                "); prepare the data again, or remove it and give "
                "--vocab-size.");
  }
  if (!value) {
    // Why, in the words of the script that wrote it: a protocol before 2
    // (no PROTO opcode first), or an entry that is an object (numpy's
    // integers and strings pickle as objects).
    const auto first = bytes.empty() ? 0x80 : static_cast<uint8_t>(bytes[0]);
    // Protocols 0 and 1 begin a dict, a list or a tuple with one of these
    // opcodes; anything else is no pickle.
    const bool old_protocol =
        first == '(' || first == '}' || first == ']' || first == ')';
    TORCH_CHECK(first == 0x80 || !old_protocol, caller, ": ", quoted(meta_path),
                " is pickled with protocol 0 or 1, which lamp does not read; "
                "pickle it with protocol 2 or later (pickle.dump(meta, f), "
                "Python 3's default), or remove it and give --vocab-size.");
    TORCH_CHECK(first == 0x80, caller, ": ", quoted(meta_path),
                " is not a pickle (it begins with the byte ",
                internal::hex_byte(first),
                ", a pickle of protocol 2 or later with 0x80); the file is "
                "damaged: prepare the data again, or remove it and give "
                "--vocab-size.");
    const auto skeleton = lamp::detail::read_plain_pickle(
        bytes.data(), bytes.size(), meta_path, /*objects_as_none=*/true);
    if (skeleton && skeleton->isGenericDict()) {
      for (const auto& entry : skeleton->toGenericDict()) {
        const bool object_value = entry.value().isNone();
        TORCH_CHECK(!entry.key().isString() || !object_value, caller, ": ",
                    quoted(meta_path), "'s ", entry.key().toStringRef(),
                    " is a Python object, not a plain value (a numpy "
                    "integer or string?); write it as Python's own (int(...), "
                    "str(...)) in the script that made it.");
      }
    }
  }
  TORCH_CHECK(value && value->isGenericDict(), caller, ": ", quoted(meta_path),
              " is not a readable pickle of a dict of plain values "
              "(nanoGPT's meta.pkl holds vocab_size, itos and stoi); prepare "
              "the data again, or remove it and give --vocab-size.");
  const auto dict = value->toGenericDict();
  int64_t vocab_size = 0;
  c10::optional<c10::impl::GenericDict> itos;
  for (const auto& entry : dict) {
    if (!entry.key().isString()) {
      continue;
    }
    const auto& key = entry.key().toStringRef();
    if (key == "vocab_size" && entry.value().isInt()) {
      vocab_size = entry.value().toInt();
    } else if (key == "itos" && entry.value().isGenericDict()) {
      itos = entry.value().toGenericDict();
    }
  }
  TORCH_CHECK(vocab_size >= 1 && vocab_size <= 2147483647LL, caller, ": ",
              quoted(meta_path),
              " has no vocab_size between 1 and 2^31 - 1 (the number of "
              "token ids); prepare the data again, or remove it and give "
              "--vocab-size.");
  if (pieces != nullptr) {
    pieces->pieces.clear();
    if (itos) {
      // As long as the largest id itos gives, not vocab_size: a damaged
      // vocab_size of billions makes no billions of empty pieces.
      int64_t pieces_size = 0;
      for (const auto& entry : *itos) {
        const bool fits = entry.key().isInt() && entry.value().isString() &&
                          entry.key().toInt() >= 0 &&
                          entry.key().toInt() < vocab_size;
        TORCH_CHECK(fits, caller, ": ", quoted(meta_path),
                    "'s itos maps ids to their text, but holds an entry "
                    "that is not an id below vocab_size ",
                    vocab_size, " with a string; prepare the data again.");
        pieces_size = std::max(pieces_size, entry.key().toInt() + 1);
      }
      pieces->pieces.resize(static_cast<size_t>(pieces_size));
      for (const auto& entry : *itos) {
        pieces->pieces[entry.key().toInt()] = entry.value().toStringRef();
      }
    }
  }
  return vocab_size;
}

TokenData read_token_files(const std::string& folder, int64_t context,
                           int64_t vocab_size) {
  const char* caller = "lamp::data::read_token_files";
  internal::check_context(context, caller);
  TORCH_CHECK(vocab_size >= 0, caller, ": vocab_size must be >= 0, got ",
              vocab_size, ".");
  TokenData data;
  const auto train_path = internal::join_path(folder, "train.bin");
  const auto val_path = internal::join_path(folder, "val.bin");
  const auto meta_path = internal::join_path(folder, "meta.pkl");
  TORCH_CHECK(internal::regular_file_exists(train_path) &&
                  internal::regular_file_exists(val_path),
              caller, ": ", quoted(folder),
              " is not a folder of token files: it needs train.bin and "
              "val.bin (nanoGPT's data/<name>/prepare.py writes them); ",
              internal::describe_directory(folder), ".");
  std::string meta_note;
  if (internal::regular_file_exists(meta_path)) {
    data.vocab_size = read_token_meta(meta_path, &data.pieces);
    data.meta_path = meta_path;
    meta_note = " (meta.pkl's vocab_size)";
  } else {
    TORCH_CHECK(vocab_size > 0, caller, ": ", quoted(folder),
                " has no meta.pkl to give the vocabulary's size; give "
                "--tokenizer FILE (the tokenizer that wrote the files, "
                "whose size it is), or --vocab-size (the tokenizer's: "
                "GPT-2's is 50257, as in nanoGPT's openwebtext and "
                "shakespeare; 50304 pads it as nanoGPT's model does).");
    data.vocab_size = vocab_size;
  }
  data.id_bytes = token_id_bytes(data.vocab_size);
  // uint16 ids of 32,768 and above read as negative int16: widened on use.
  const bool unsigned_ids = data.id_bytes == 2 && data.vocab_size > 32768;
  const auto load = [&](const std::string& path, int64_t& tokens) {
    auto ids = map_token_file(path, data.id_bytes);
    tokens = ids.size(0);
    TORCH_CHECK(tokens >= context + 1, caller, ": ", quoted(path), " holds ",
                tokens, " ", width_name(data.id_bytes),
                " ids, which make no window of context ", context,
                " (it needs ", context + 1,
                "); give a shorter --context, or more data in the file.");
    check_ids(ids, data.vocab_size, path, meta_note);
    return windows_of(ids, context, unsigned_ids);
  };
  data.train = load(train_path, data.train_tokens);
  data.validation = load(val_path, data.validation_tokens);
  return data;
}

int64_t padded_vocab_size(int64_t vocab_size) {
  TORCH_CHECK(vocab_size >= 1 && vocab_size <= 2147483647LL - 63,
              "lamp::data::padded_vocab_size: vocab_size must be in [1, "
              "2^31 - 64], got ",
              vocab_size, ".");
  return (vocab_size + 63) / 64 * 64;
}

} // namespace data
} // namespace lamp
