#include "lamp/data/byte_pair.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <cstdint>
#include <deque>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "data/byte_pair_format.h"
#include "data/byte_pair_split.h"
#include "data/files.h"
#include "data/token_ids.h"

namespace lamp {
namespace data {

namespace {

using internal::quoted;
using Json = nlohmann::json;

constexpr const char* kEndOfText = "<|endoftext|>";
constexpr int32_t kNoRank = INT32_MAX;
// The longest piece whose merges encode_piece() finds by scanning its pairs.
constexpr size_t kScannedPieceBytes = 128;

// A pair of adjacent tokens, as Hugging Face's merges key them.
uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

} // namespace

namespace detail {

// The loaded tokenizer (BytePairEncoding's, shared by its copies).
struct BytePairModel {
  std::string origin;
  // Each id's bytes, and whether it has a token (ids may have gaps).
  std::vector<std::string> tokens;
  std::vector<bool> has_token;
  // The tokens as read, laid out by id in `tokens` once all are in
  // (lay_out()): an id far beyond the others is refused there, not
  // allocated, whatever order the file holds them in.
  std::vector<std::pair<int32_t, std::string>> read;
  std::unordered_set<int32_t> read_ids;
  // Special tokens' texts by id: decoded, never encoded (tiktoken's
  // encode_ordinary()).
  std::unordered_map<int64_t, std::string> specials;
  // The tokens by their bytes (views into `tokens`, which never change
  // after loading), and each byte's token.
  std::unordered_map<std::string_view, int32_t> ids;
  std::array<int32_t, 256> byte_ids{};
  // tiktoken's rule: a pair merges by its bytes' rank (its token's id),
  // and a piece that is a token whole is that token. Hugging Face's: a
  // pair merges by its merge's rank, the merges in `merges`;
  // whole_piece_first where its model says ignore_merges.
  bool ranks_are_ids = true;
  bool whole_piece_first = true;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  BytePairSplit split = BytePairSplit::kGpt2;

  void add_token(int64_t id, std::string bytes, const std::string& where);
  void lay_out(const std::string& path);
  void index(const std::string& path);
  std::pair<int32_t, int32_t> rank(std::string_view piece, size_t begin,
                                   size_t end, int32_t left,
                                   int32_t right) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_long_piece(std::string_view piece,
                        std::vector<int32_t>& out) const;
};

} // namespace detail

void detail::BytePairModel::add_token(int64_t id, std::string bytes,
                                      const std::string& where) {
  TORCH_CHECK(id >= 0 && id < (int64_t{1} << 30), where, " has the id ", id,
              ", outside 0 ... 2^30 - 1; give the tokenizer's own file.");
  TORCH_CHECK(read_ids.insert(static_cast<int32_t>(id)).second, where,
              " has the id ", id,
              ", which another token has already; the file is damaged: "
              "give the tokenizer's own file.");
  TORCH_CHECK(!bytes.empty(), where,
              " is an empty token; the file is damaged: give the "
              "tokenizer's own file.");
  read.emplace_back(static_cast<int32_t>(id), std::move(bytes));
}

// The tokens read, by id. A byte-level BPE's ids are its tokens' ranks,
// 0 ... n - 1: tiktoken's files leave a gap or two where its special
// tokens go, Hugging Face's none. So a largest id beyond twice the tokens
// (and some slack for a small vocabulary with its specials) is a damaged
// id, refused before a table of that length is made: one id near 2^30
// would ask 34 GB of a 50,000-token file.
// The same bound holds for a tokenizer.json's added tokens (its specials).
constexpr int64_t kIdSlack = 1024;

void detail::BytePairModel::lay_out(const std::string& path) {
  constexpr int64_t kSlack = kIdSlack;
  int64_t last = -1;
  for (const auto& token : read) {
    last = std::max<int64_t>(last, token.first);
  }
  const auto n = static_cast<int64_t>(read.size());
  TORCH_CHECK(last < 2 * n + kSlack, quoted(path), " holds ", n,
              " tokens but one has the id ", last,
              ": a byte-level BPE's ids are its tokens' ranks, 0 ... ", n - 1,
              " with few gaps; the file is damaged: give the tokenizer's own "
              "file.");
  tokens.assign(static_cast<size_t>(last + 1), std::string());
  has_token.assign(static_cast<size_t>(last + 1), false);
  for (auto& [id, bytes] : read) {
    tokens[static_cast<size_t>(id)] = std::move(bytes);
    has_token[static_cast<size_t>(id)] = true;
  }
  read = {};
  read_ids = {};
}

// The lookups, once every token is in; refuses a vocabulary that lacks a
// byte or holds a token twice.
void detail::BytePairModel::index(const std::string& path) {
  ids.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!has_token[id]) {
      continue;
    }
    const std::string_view bytes(tokens[id]);
    const auto [at, added] = ids.emplace(bytes, static_cast<int32_t>(id));
    TORCH_CHECK(added, quoted(path), " holds one token as both id ", at->second,
                " and id ", id,
                "; the file is damaged: give the tokenizer's own file.");
  }
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    const auto at = ids.find(std::string_view(&byte, 1));
    TORCH_CHECK(at != ids.end(), quoted(path), " has no token for the byte ",
                internal::hex_byte(static_cast<uint8_t>(b)),
                ": it is not a byte-level BPE, which has one for each of the "
                "256 bytes (GPT-2's has). Give a byte-level BPE's file.");
    byte_ids[static_cast<size_t>(b)] = at->second;
  }
}

// The rank of merging the symbols piece[begin, mid) (`left`) and
// piece[mid, end) (`right`) and the token it makes, or kNoRank.
std::pair<int32_t, int32_t> detail::BytePairModel::rank(std::string_view piece,
                                                        size_t begin,
                                                        size_t end,
                                                        int32_t left,
                                                        int32_t right) const {
  if (ranks_are_ids) {
    const auto at = ids.find(piece.substr(begin, end - begin));
    if (at == ids.end()) {
      return {kNoRank, -1};
    }
    return {at->second, at->second};
  }
  const auto at = merges.find(pair_key(left, right));
  if (at == merges.end()) {
    return {kNoRank, -1};
  }
  return at->second;
}

// tiktoken's byte_pair_merge: the piece's bytes as tokens, then the pair of
// lowest rank merged, the leftmost among equals, until none merges. A
// short piece (most are a word) finds each pair by a scan; a longer one
// through a heap (merge_long_piece), or its scans' n^2 would take minutes
// for a piece of a few hundred kB (a run of one character, a line of
// digits or dashes).
void detail::BytePairModel::encode_piece(std::string_view piece,
                                         std::vector<int32_t>& out) const {
  if (whole_piece_first) {
    const auto at = ids.find(piece);
    if (at != ids.end()) {
      out.push_back(at->second);
      return;
    }
  }
  if (piece.size() > kScannedPieceBytes) {
    merge_long_piece(piece, out);
    return;
  }
  struct Symbol {
    size_t begin;
    int32_t id;
    int32_t rank;   // of merging it with the next symbol
    int32_t merged; // the token that merge makes
  };
  std::vector<Symbol> s;
  s.reserve(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    s.push_back(
        {i, byte_ids[static_cast<unsigned char>(piece[i])], kNoRank, -1});
  }
  const auto end_of = [&](size_t i) {
    return i < s.size() ? s[i].begin : piece.size();
  };
  const auto rank_at = [&](size_t i) {
    if (i + 1 >= s.size()) {
      s[i].rank = kNoRank;
      return;
    }
    const auto r = rank(piece, s[i].begin, end_of(i + 2), s[i].id, s[i + 1].id);
    s[i].rank = r.first;
    s[i].merged = r.second;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    rank_at(i);
  }
  while (s.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < s.size(); ++i) {
      if (s[i].rank < s[best].rank) {
        best = i;
      }
    }
    if (s[best].rank == kNoRank) {
      break;
    }
    s[best].id = s[best].merged;
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    rank_at(best);
    if (best > 0) {
      rank_at(best - 1);
    }
  }
  for (const auto& symbol : s) {
    out.push_back(symbol.id);
  }
}

// encode_piece()'s merges in n log n: the symbols linked both ways, each
// named by the byte it begins at (so that the leftmost of equal ranks is
// the smallest), the pairs that merge in a heap by (rank, begin). A symbol
// re-ranked or merged away counts up its version, which makes its older
// entries stale: they are dropped as they come up.
void detail::BytePairModel::merge_long_piece(std::string_view piece,
                                             std::vector<int32_t>& out) const {
  constexpr size_t kNone = SIZE_MAX;
  const size_t n = piece.size();
  struct Symbol {
    int32_t id;
    int32_t merged; // the token merging it with the next makes
    uint32_t version;
    size_t previous;
    size_t next;
  };
  std::vector<Symbol> s(n);
  for (size_t i = 0; i < n; ++i) {
    s[i] = {byte_ids[static_cast<unsigned char>(piece[i])], -1, 0,
            i == 0 ? kNone : i - 1, i + 1 < n ? i + 1 : kNone};
  }
  struct Pair {
    int32_t rank;
    size_t begin;
    uint32_t version;
  };
  const auto later = [](const Pair& a, const Pair& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.begin > b.begin;
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(later)> pairs(later);
  const auto rank_at = [&](size_t i) {
    auto& symbol = s[i];
    ++symbol.version;
    if (symbol.next == kNone) {
      return;
    }
    const size_t after = s[symbol.next].next;
    const auto r = rank(piece, i, after == kNone ? n : after, symbol.id,
                        s[symbol.next].id);
    if (r.first != kNoRank) {
      symbol.merged = r.second;
      pairs.push({r.first, i, symbol.version});
    }
  };
  for (size_t i = 0; i < n; ++i) {
    rank_at(i);
  }
  while (!pairs.empty()) {
    const Pair pair = pairs.top();
    pairs.pop();
    auto& left = s[pair.begin];
    if (pair.version != left.version) {
      continue;
    }
    auto& right = s[left.next];
    ++right.version;
    left.id = left.merged;
    left.next = right.next;
    if (left.next != kNone) {
      s[left.next].previous = pair.begin;
    }
    rank_at(pair.begin);
    if (left.previous != kNone) {
      rank_at(left.previous);
    }
  }
  for (size_t i = 0; i != kNone; i = s[i].next) {
    out.push_back(s[i].id);
  }
}

namespace {

// GPT-2's map of the 256 bytes onto printable characters, in which
// Hugging Face's vocab.json and merges.txt spell tokens: the printable
// Latin-1 bytes as themselves, the others as U+0100 onwards in byte order.
// Returns, for each code point below 0x144, its byte or -1.
const std::array<int, 0x144>& gpt2_character_bytes() {
  static const std::array<int, 0x144> table = [] {
    std::array<int, 0x144> t{};
    t.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') ||
                             (b >= 0xA1 && b <= 0xAC) ||
                             (b >= 0xAE && b <= 0xFF);
      t[static_cast<size_t>(printable ? b : 256 + next++)] = b;
    }
    return t;
  }();
  return table;
}

// `token` (UTF-8, in GPT-2's byte map) as its bytes; false where a
// character is outside the map.
bool from_gpt2_characters(const std::string& token, std::string& bytes) {
  const auto& table = gpt2_character_bytes();
  bytes.clear();
  for (size_t i = 0; i < token.size();) {
    const auto c = static_cast<unsigned char>(token[i]);
    uint32_t code = 0;
    size_t length = 0;
    if (c < 0x80) {
      code = c;
      length = 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < token.size()) {
      code = ((c & 0x1Fu) << 6) |
             (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      length = 2;
    } else {
      return false; // three bytes and more: beyond U+07FF, outside the map
    }
    if (code >= table.size() || table[code] < 0) {
      return false;
    }
    bytes.push_back(static_cast<char>(table[code]));
    i += length;
  }
  return !bytes.empty();
}

Json parse_json(const std::string& text, const std::string& path) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    TORCH_CHECK(false, quoted(path), " is not valid JSON (at byte ", e.byte,
                "): a truncated or damaged file; give the tokenizer's own "
                "file.");
  }
  return Json();
}

std::string token_shown(const std::string& token) {
  return quoted(token.size() > 40 ? token.substr(0, 40) + "..." : token);
}

// Calls row(line, text) for each line of `text` (numbered from 1, without
// its "\n" or "\r\n").
template <typename Row>
void for_each_line(const std::string& text, Row row) {
  size_t start = 0;
  int64_t line = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      end = text.size();
    }
    std::string_view view(text.data() + start, end - start);
    if (!view.empty() && view.back() == '\r') {
      view.remove_suffix(1);
    }
    row(++line, view);
    start = end + 1;
  }
}

// tiktoken's file: "BASE64 ID" a line.
void read_tiktoken(detail::BytePairModel& m, const std::string& text,
                   const std::string& path) {
  static const std::array<int, 256> values = [] {
    std::array<int, 256> v{};
    v.fill(-1);
    const std::string alphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < alphabet.size(); ++i) {
      v[static_cast<unsigned char>(alphabet[i])] = static_cast<int>(i);
    }
    return v;
  }();
  for_each_line(text, [&](int64_t line, std::string_view row) {
    if (row.empty()) {
      return;
    }
    const std::string where =
        "line " + std::to_string(line) + " of " + quoted(path);
    const size_t space = row.find(' ');
    const auto shown = token_shown(std::string(row));
    TORCH_CHECK(space != std::string_view::npos && space > 0 &&
                    space + 1 < row.size() && space % 4 == 0,
                where, " (", shown,
                ") is not a token in tiktoken's form, its bytes in base64, "
                "a space and its id; give a .tiktoken file, or Hugging "
                "Face's tokenizer.json or vocab.json.");
    std::string bytes;
    uint32_t bits = 0;
    int count = 0;
    size_t padding = 0;
    for (size_t i = 0; i < space; ++i) {
      const auto c = static_cast<unsigned char>(row[i]);
      if (c == '=' && i + 2 >= space) {
        ++padding;
        continue;
      }
      TORCH_CHECK(values[c] >= 0 && padding == 0, where, " (", shown,
                  ") is not base64 before its space; the file is damaged: "
                  "give the tokenizer's own file.");
      bits = (bits << 6) | static_cast<uint32_t>(values[c]);
      if (++count == 4) {
        bytes.push_back(static_cast<char>((bits >> 16) & 0xFF));
        bytes.push_back(static_cast<char>((bits >> 8) & 0xFF));
        bytes.push_back(static_cast<char>(bits & 0xFF));
        bits = 0;
        count = 0;
      }
    }
    if (count == 3) {
      bytes.push_back(static_cast<char>((bits >> 10) & 0xFF));
      bytes.push_back(static_cast<char>((bits >> 2) & 0xFF));
    } else if (count == 2) {
      bytes.push_back(static_cast<char>((bits >> 4) & 0xFF));
    }
    int64_t id = 0;
    bool digits = true;
    for (size_t i = space + 1; i < row.size(); ++i) {
      digits = digits && row[i] >= '0' && row[i] <= '9' && id < (1 << 30);
      id = id * 10 + (row[i] - '0');
    }
    TORCH_CHECK(digits, where, " (", shown,
                ") has no id (a whole number) after its space; the file is "
                "damaged: give the tokenizer's own file.");
    m.add_token(id, std::move(bytes), where);
  });
  m.lay_out(path);
  TORCH_CHECK(!m.tokens.empty(), quoted(path),
              " holds no token; give a .tiktoken file of a byte-level BPE.");
  m.ranks_are_ids = true;
  m.whole_piece_first = true;
  // tiktoken keeps an encoding's pattern and special tokens in its code,
  // apart from the file: the encodings of other splits are known by their
  // number of tokens (ids 0 ... n - 1), with tiktoken's specials.
  const auto count = static_cast<size_t>(
      std::count(m.has_token.begin(), m.has_token.end(), true));
  if (count == m.tokens.size() && count == 100256) {
    m.split = BytePairSplit::kCl100k;
    m.specials = {{100257, kEndOfText},
                  {100258, "<|fim_prefix|>"},
                  {100259, "<|fim_middle|>"},
                  {100260, "<|fim_suffix|>"},
                  {100276, "<|endofprompt|>"}};
    return;
  }
  if (count == m.tokens.size() && count == 199998) {
    m.split = BytePairSplit::kO200k;
    m.specials = {{199999, kEndOfText}, {200018, "<|endofprompt|>"}};
    return;
  }
  // Else (GPT-2's split): <|endoftext|> takes the first id without a token,
  // after the last (r50k_base's and gpt2's 50256) or in a gap the file
  // leaves for it (p50k_base's 50256 among 50,281 ids).
  const auto gap = std::find(m.has_token.begin(), m.has_token.end(), false);
  m.specials.emplace(static_cast<int64_t>(gap - m.has_token.begin()),
                     kEndOfText);
}

// Hugging Face's vocab (an object of token: id) in GPT-2's byte map.
void read_vocab(detail::BytePairModel& m, const Json& vocab,
                const std::string& path) {
  TORCH_CHECK(vocab.is_object() && !vocab.empty(), quoted(path),
              " holds no vocabulary (an object of token: id); give Hugging "
              "Face's vocab.json or tokenizer.json of a byte-level BPE.");
  std::string bytes;
  for (const auto& [token, id] : vocab.items()) {
    const std::string where =
        "the token " + token_shown(token) + " of " + quoted(path);
    TORCH_CHECK(id.is_number_integer(), where,
                " has no whole-number id; the file is damaged: give the "
                "tokenizer's own file.");
    TORCH_CHECK(from_gpt2_characters(token, bytes), where,
                " is not spelled in GPT-2's byte map (the characters its "
                "byte-level BPE writes bytes as): this is not a byte-level "
                "BPE's vocabulary (a SentencePiece model's, Llama's or "
                "T5's, is read from its .model file instead).");
    m.add_token(id.get<int64_t>(), bytes, where);
  }
  m.lay_out(path);
}

// Hugging Face's merges, best first: "A B" strings (merges.txt's lines,
// older tokenizer.json) or ["A", "B"] pairs (newer tokenizer.json).
void read_merges(detail::BytePairModel& m,
                 const std::vector<std::pair<std::string, std::string>>& pairs,
                 const std::vector<std::string>& where) {
  std::string left, right;
  for (size_t r = 0; r < pairs.size(); ++r) {
    const bool spelled = from_gpt2_characters(pairs[r].first, left) &&
                         from_gpt2_characters(pairs[r].second, right);
    TORCH_CHECK(spelled, where[r], " (", token_shown(pairs[r].first), " ",
                token_shown(pairs[r].second),
                ") is not spelled in GPT-2's byte map; the file is not a "
                "byte-level BPE's merges: give the tokenizer's own file.");
    const auto a = m.ids.find(left);
    const auto b = m.ids.find(right);
    const auto made = m.ids.find(left + right);
    TORCH_CHECK(a != m.ids.end() && b != m.ids.end() && made != m.ids.end(),
                where[r], " merges ", token_shown(pairs[r].first), " and ",
                token_shown(pairs[r].second), ", but the vocabulary lacks ",
                a == m.ids.end()   ? token_shown(pairs[r].first)
                : b == m.ids.end() ? token_shown(pairs[r].second)
                                   : "the token they make",
                ": the merges and the vocabulary are not one tokenizer's; "
                "give the pair from one tokenizer.");
    // A pair listed twice keeps its first (best) rank, as Hugging Face's.
    m.merges.emplace(pair_key(a->second, b->second),
                     std::make_pair(static_cast<int32_t>(r), made->second));
  }
  m.ranks_are_ids = false;
}

// A merge written "A B": its two tokens, or a refusal naming `at` and
// `fix`.
std::pair<std::string, std::string> merge_of(const std::string& text,
                                             const std::string& at,
                                             const char* fix) {
  const size_t space = text.find(' ');
  TORCH_CHECK(space != std::string::npos && space > 0 &&
                  text.find(' ', space + 1) == std::string::npos &&
                  space + 1 < text.size(),
              at, " (", token_shown(text),
              ") is not a merge, two tokens with a space between; ", fix);
  return {text.substr(0, space), text.substr(space + 1)};
}

void read_merges_file(detail::BytePairModel& m, const std::string& path) {
  const auto text =
      internal::read_small_file(path, "lamp::data::BytePairEncoding::load");
  std::vector<std::pair<std::string, std::string>> pairs;
  std::vector<std::string> where;
  for_each_line(text, [&](int64_t line, std::string_view view) {
    const std::string row(view);
    if (row.empty() || (line == 1 && row.rfind("#version", 0) == 0)) {
      return;
    }
    const std::string at =
        "line " + std::to_string(line) + " of " + quoted(path);
    pairs.push_back(merge_of(row, at,
                             "give the merges.txt (or vocab.bpe) of the "
                             "vocabulary's tokenizer."));
    where.push_back(at);
  });
  read_merges(m, pairs, where);
}

// The patterns a Hugging Face Split pre-tokenizer may hold, as the
// tokenizer.json files of the tokenizers that use them write them (GPT-2's
// in two forms, cl100k_base's as Llama 3's files and tiktoken before 0.8
// write it, o200k_base's). tiktoken 0.8's possessive forms are not among
// them: Hugging Face's regex engine reads `{1,3}+` as a repeat, not as
// possessive, so its ids would not be tiktoken's.
struct KnownPattern {
  const char* regex;
  BytePairSplit split;
};
constexpr KnownPattern kKnownPatterns[] = {
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
     BytePairSplit::kGpt2},
    {R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
     BytePairSplit::kGpt2},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     BytePairSplit::kLlama3},
    {R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)",
     BytePairSplit::kLlama3},
    {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     BytePairSplit::kO200k},
};

// Hugging Face's tokenizer.json: a BPE model whose text is split as one of
// the known patterns splits it (the ByteLevel pre-tokenizer with GPT-2's
// pattern, or a Split by a pattern and then ByteLevel without one; no
// prefix space, no normalizer). Returns the split.
BytePairSplit read_tokenizer_json(detail::BytePairModel& m, const Json& json,
                                  const std::string& path) {
  const auto kind = [](const Json& part) {
    return part.is_object() && part.contains("type") && part["type"].is_string()
               ? part["type"].get<std::string>()
               : std::string("?");
  };
  const auto& model = json["model"];
  TORCH_CHECK(model.is_object() && kind(model) == "BPE", quoted(path),
              " is a tokenizer of the kind ", quoted(kind(model)),
              ", not a BPE; lamp reads byte-level BPEs (GPT-2's kind) from "
              "Hugging Face's files, and SentencePiece models from their "
              ".model file.");
  const auto field = [&](const Json& part, const char* name) {
    return part.contains(name) ? part[name] : Json();
  };
  const auto flag = [&](const Json& part, const char* name, bool absent) {
    const auto value = field(part, name);
    return value.is_boolean() ? value.get<bool>() : absent && value.is_null();
  };
  const auto normalizer = field(json, "normalizer");
  TORCH_CHECK(normalizer.is_null(), quoted(path),
              " normalizes the text first (its normalizer is ",
              quoted(kind(normalizer)),
              "), which a byte-level BPE as GPT-2's does not; lamp reads "
              "that kind only.");
  const auto split = field(json, "pre_tokenizer");
  // ByteLevel's use_regex is true where absent, add_prefix_space false.
  const auto byte_level = [&](const Json& part, bool with_pattern) {
    return kind(part) == "ByteLevel" &&
           flag(part, "use_regex", true) == with_pattern &&
           !flag(part, "add_prefix_space", false);
  };
  std::string pattern;
  BytePairSplit found = BytePairSplit::kAuto;
  if (byte_level(split, true)) {
    found = BytePairSplit::kGpt2;
  } else if (kind(split) == "Sequence" &&
             field(split, "pretokenizers").is_array() &&
             field(split, "pretokenizers").size() == 2) {
    const auto& parts = split["pretokenizers"];
    const auto regex = field(field(parts[0], "pattern"), "Regex");
    if (kind(parts[0]) == "Split" && regex.is_string() &&
        field(parts[0], "behavior") == "Isolated" &&
        !flag(parts[0], "invert", false) && byte_level(parts[1], false)) {
      pattern = regex.get<std::string>();
      for (const auto& known : kKnownPatterns) {
        if (pattern == known.regex) {
          found = known.split;
        }
      }
    }
  }
  TORCH_CHECK(found != BytePairSplit::kAuto, quoted(path),
              " splits the text otherwise than lamp can (its pre-tokenizer "
              "is ",
              quoted(kind(split)),
              kind(split) == "ByteLevel"
                  ? std::string(" with add_prefix_space or without its pattern")
                  : std::string(),
              pattern.empty()
                  ? std::string()
                  // As a JSON string, as the file writes it: the
                  // pattern's own quotes and backslashes read unambiguously.
                  : c10::str(", a Split by the pattern ",
                             nlohmann::json(pattern).dump()),
              "), and would give other ids than this tokenizer's own. lamp "
              "splits as GPT-2's ByteLevel pre-tokenizer (without "
              "add_prefix_space), or a Split by the pattern of cl100k_base, "
              "Llama 3 or o200k_base followed by ByteLevel without its "
              "pattern.");
  for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto affix = field(model, name);
    TORCH_CHECK(affix.is_null() || affix == "", quoted(path), "'s model has a ",
                name, " (", affix.dump(),
                "), which a byte-level BPE as GPT-2's has not; give a "
                "byte-level BPE's file.");
  }
  TORCH_CHECK(!field(model, "byte_fallback").is_boolean() ||
                  !field(model, "byte_fallback").get<bool>(),
              quoted(path),
              "'s model has byte_fallback, which a byte-level "
              "BPE as GPT-2's has not; give a byte-level BPE's file.");
  read_vocab(m, field(model, "vocab"), path);
  const auto added = field(json, "added_tokens");
  if (added.is_array()) {
    for (const auto& token : added) {
      TORCH_CHECK(token.is_object() && field(token, "id").is_number_integer() &&
                      field(token, "content").is_string(),
                  quoted(path), "'s added_tokens hold ", token.dump(),
                  ", not an object with an id and a content; the file is "
                  "damaged: give the tokenizer's own file.");
      const auto id = token["id"].get<int64_t>();
      const auto content = token["content"].get<std::string>();
      const bool known = id >= 0 &&
                         static_cast<size_t>(id) < m.has_token.size() &&
                         m.has_token[static_cast<size_t>(id)];
      if (!known) {
        // As the tokens' ids (lay_out()): near their ranks, not 2^30 away,
        // which would make a vocabulary of 2^30 ids.
        const auto tokens = static_cast<int64_t>(m.has_token.size());
        TORCH_CHECK(
            id >= 0 && id < 2 * tokens + kIdSlack && m.specials.count(id) == 0,
            quoted(path), "'s added token ", token_shown(content),
            " has the id ", id, ", outside 0 ... ", 2 * tokens + kIdSlack - 1,
            " (its ", tokens,
            " tokens' ids with few gaps) or another's; the "
            "file is damaged: give the tokenizer's own file.");
        m.specials.emplace(id, content);
      }
    }
  }
  m.index(path);
  const auto merges = field(model, "merges");
  TORCH_CHECK(merges.is_array(), quoted(path),
              "'s model holds no merges (a list); the file is damaged: give "
              "the tokenizer's own file.");
  std::vector<std::pair<std::string, std::string>> pairs;
  std::vector<std::string> where;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& merge = merges[r];
    const std::string at = "merge " + std::to_string(r) + " of " + quoted(path);
    if (merge.is_string()) {
      pairs.push_back(merge_of(merge.get<std::string>(), at,
                               "the file is damaged: give the tokenizer's "
                               "own file."));
    } else {
      TORCH_CHECK(merge.is_array() && merge.size() == 2 &&
                      merge[0].is_string() && merge[1].is_string(),
                  at, " (", merge.dump(),
                  ") is not two tokens; the file is damaged: give the "
                  "tokenizer's own file.");
      pairs.emplace_back(merge[0].get<std::string>(),
                         merge[1].get<std::string>());
    }
    where.push_back(at);
  }
  read_merges(m, pairs, where);
  m.whole_piece_first = flag(model, "ignore_merges", false);
  return found;
}

std::string beside(const std::string& path, const std::string& name) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? name : path.substr(0, slash + 1) + name;
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

} // namespace

namespace internal {

BytePairFile byte_pair_file_kind(const std::string& head) {
  if (head.rfind("#version", 0) == 0) {
    return BytePairFile::kMerges;
  }
  size_t i = head.find_first_not_of(" \t\r\n");
  if (i == std::string::npos) {
    return BytePairFile::kNone;
  }
  if (head[i] == '{') {
    return BytePairFile::kJson;
  }
  const size_t start = i;
  while (i < head.size() &&
         (std::isalnum(static_cast<unsigned char>(head[i])) || head[i] == '+' ||
          head[i] == '/' || head[i] == '=')) {
    ++i;
  }
  if (i == start || i >= head.size() || head[i] != ' ') {
    return BytePairFile::kNone;
  }
  size_t j = i + 1;
  while (j < head.size() && head[j] >= '0' && head[j] <= '9') {
    ++j;
  }
  const bool line_ends = j == head.size() || head[j] == '\n' || head[j] == '\r';
  return j > i + 1 && line_ends ? BytePairFile::kTiktoken : BytePairFile::kNone;
}

} // namespace internal

bool byte_pair_encode_available() {
  return detail::byte_pair_split_available();
}

std::string byte_pair_split_name(BytePairSplit split) {
  switch (split) {
    case BytePairSplit::kGpt2:
      return "GPT-2's";
    case BytePairSplit::kCl100k:
      return "cl100k_base's";
    case BytePairSplit::kLlama3:
      return "Llama 3's";
    case BytePairSplit::kO200k:
      return "o200k_base's";
    default:
      return "the file's";
  }
}

BytePairEncoding BytePairEncoding::load(const std::string& path,
                                        BytePairSplit split) {
  const char* caller = "lamp::data::BytePairEncoding::load";
  auto m = std::make_shared<detail::BytePairModel>();
  std::string file = path;
  if (internal::directory_exists(path)) {
    const auto json = internal::join_path(path, "tokenizer.json");
    const auto vocab = internal::join_path(path, "vocab.json");
    const auto encoder = internal::join_path(path, "encoder.json");
    if (internal::regular_file_exists(json)) {
      file = json;
    } else if (internal::regular_file_exists(vocab)) {
      file = vocab;
    } else if (internal::regular_file_exists(encoder)) {
      file = encoder;
    } else {
      TORCH_CHECK(false, caller, ": ", internal::describe_directory(path),
                  ", none of a tokenizer's files (tokenizer.json, or "
                  "vocab.json with merges.txt, or encoder.json with "
                  "vocab.bpe); give the folder that holds them, or the file.");
    }
  }
  const auto text = internal::read_small_file(file, caller);
  const auto kind = internal::byte_pair_file_kind(text.substr(0, 256));
  m->origin = file;
  if (kind == internal::BytePairFile::kJson) {
    const auto json = parse_json(text, file);
    // A vocab.json may hold the token "model": tokenizer.json's is an object.
    if (json.is_object() && json.contains("model") &&
        json["model"].is_object()) {
      const auto own = read_tokenizer_json(*m, json, file);
      TORCH_CHECK(split == BytePairSplit::kAuto || split == own, caller, ": ",
                  quoted(file), " splits the text as ",
                  byte_pair_split_name(own), " pattern, not as ",
                  byte_pair_split_name(split),
                  ", which was asked for: its ids are its own only with its "
                  "split; leave the split to the file (BytePairSplit::kAuto).");
      m->split = own;
    } else {
      // vocab.json (encoder.json): its merges beside it, under either name.
      const bool gpt2_names = base_name(file) == "encoder.json";
      const auto first_name = gpt2_names ? "vocab.bpe" : "merges.txt";
      const auto second_name = gpt2_names ? "merges.txt" : "vocab.bpe";
      auto merges = beside(file, first_name);
      if (!internal::regular_file_exists(merges)) {
        merges = beside(file, second_name);
      }
      TORCH_CHECK(internal::regular_file_exists(merges), caller, ": ",
                  quoted(file), " is a vocabulary without its merges: neither ",
                  quoted(beside(file, first_name)), " nor ",
                  quoted(beside(file, second_name)),
                  " is a file; put the tokenizer's merges beside it, or give "
                  "its tokenizer.json.");
      read_vocab(*m, json, file);
      m->index(file);
      read_merges_file(*m, merges);
      m->whole_piece_first = false;
      m->origin = file + " with " + merges;
    }
  } else {
    TORCH_CHECK(kind == internal::BytePairFile::kTiktoken, caller, ": ",
                quoted(file),
                " is no tokenizer lamp reads as a byte-level BPE: not "
                "tiktoken's form (a token's bytes in base64 and its id a "
                "line), nor Hugging Face's tokenizer.json or vocab.json",
                kind == internal::BytePairFile::kMerges
                    ? " (it looks like a merges file: give the vocab.json "
                      "beside it)"
                    : "",
                "; give one of those.");
    read_tiktoken(*m, text, file);
    m->index(file);
  }
  if (split != BytePairSplit::kAuto) {
    m->split = split;
  }
  return BytePairEncoding(std::move(m));
}

const detail::BytePairModel& BytePairEncoding::model() const {
  TORCH_CHECK(impl_ != nullptr,
              "lamp::data::BytePairEncoding: no tokenizer was loaded (a "
              "default-constructed BytePairEncoding); call "
              "BytePairEncoding::load().");
  return *impl_;
}

int64_t BytePairEncoding::vocab_size() const {
  const auto& m = model();
  int64_t size = static_cast<int64_t>(m.tokens.size());
  for (const auto& special : m.specials) {
    size = std::max(size, special.first + 1);
  }
  return size;
}

const std::string& BytePairEncoding::origin() const {
  return model().origin;
}

BytePairSplit BytePairEncoding::split() const {
  return model().split;
}

std::string BytePairEncoding::describe() const {
  return "byte-level BPE (" + byte_pair_split_name(split()) + " split), " +
         std::to_string(vocab_size()) + " ids";
}

std::string BytePairEncoding::vocabulary_bytes() const {
  const auto& m = model();
  std::string out;
  const auto append = [&out](const std::string& bytes) {
    out += std::to_string(bytes.size()) + ":" + bytes;
  };
  for (int64_t id = 0; id < vocab_size(); ++id) {
    const auto special = m.specials.find(id);
    if (static_cast<size_t>(id) < m.tokens.size() &&
        m.has_token[static_cast<size_t>(id)]) {
      append(m.tokens[static_cast<size_t>(id)]);
    } else if (special != m.specials.end()) {
      append(special->second);
    } else {
      out += "-:";
    }
  }
  return out;
}

struct BytePairCache::Impl {
  // The model the pieces are of, held so that no other takes its address.
  std::shared_ptr<const detail::BytePairModel> model;
  // Each piece's ids, merged[first, second); the keys view `pieces`,
  // whose strings a deque never moves.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;
  std::deque<std::string> pieces;
  std::vector<int32_t> merged;
};

BytePairCache::BytePairCache() : impl_(std::make_unique<Impl>()) {}

BytePairCache::~BytePairCache() = default;

int64_t BytePairCache::size() const {
  return static_cast<int64_t>(impl_->seen.size());
}

namespace {

// The pieces a cache holds at most: a corpus of many distinct pieces keeps
// its memory bounded.
constexpr size_t kCachedPieces = size_t{1} << 20;

// `text`'s ids onto `ids`, each piece merged once: those in `seen` are
// copied from `merged`. `key(piece)` gives a new piece's key: the piece
// itself (a view into the text) for one call, a view of a copy for a cache
// kept across calls.
template <typename Key>
void encode_text(
    const detail::BytePairModel& m, const std::string& text,
    std::unordered_map<std::string_view, std::pair<size_t, size_t>>& seen,
    std::vector<int32_t>& merged, std::vector<int32_t>& ids, Key key) {
  detail::byte_pair_split(text, m.split, [&](size_t begin, size_t end) {
    const std::string_view piece(text.data() + begin, end - begin);
    if (piece.size() == 1) {
      ids.push_back(m.byte_ids[static_cast<unsigned char>(piece[0])]);
      return;
    }
    const auto at = seen.find(piece);
    if (at != seen.end()) {
      ids.insert(
          ids.end(),
          merged.begin() + static_cast<std::ptrdiff_t>(at->second.first),
          merged.begin() + static_cast<std::ptrdiff_t>(at->second.second));
      return;
    }
    const size_t from = ids.size();
    m.encode_piece(piece, ids);
    if (seen.size() < kCachedPieces) {
      const size_t start = merged.size();
      merged.insert(merged.end(),
                    ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end());
      seen.emplace(key(piece), std::make_pair(start, merged.size()));
    }
  });
}

} // namespace

torch::Tensor BytePairEncoding::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // Texts repeat their words: each piece is merged once a call.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;
  std::vector<int32_t> merged;
  encode_text(model(), text, seen, merged, ids,
              [](std::string_view piece) { return piece; });
  return internal::token_ids_tensor(ids);
}

torch::Tensor BytePairEncoding::encode(const std::string& text,
                                       BytePairCache& cache) const {
  const auto& m = model();
  auto& c = *cache.impl_;
  if (c.model != impl_) {
    c.seen.clear();
    c.pieces.clear();
    c.merged.clear();
    c.model = impl_;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  encode_text(m, text, c.seen, c.merged, ids, [&c](std::string_view piece) {
    c.pieces.emplace_back(piece);
    return std::string_view(c.pieces.back());
  });
  return internal::token_ids_tensor(ids);
}

int64_t BytePairEncoding::special_id(const std::string& text) const {
  const auto& m = model();
  for (const auto& special : m.specials) {
    if (special.second == text) {
      return special.first;
    }
  }
  // GPT-2's own files (encoder.json, vocab.json, a tokenizer.json whose
  // vocabulary holds it) list <|endoftext|> among the tokens, as id 50256.
  const auto token = m.ids.find(text);
  return token == m.ids.end() ? -1 : token->second;
}

int64_t BytePairEncoding::end_of_text_id() const {
  const int64_t id = special_id(kEndOfText);
  return id >= 0 ? id : special_id("<|end_of_text|>");
}

std::string BytePairEncoding::decode(const torch::Tensor& ids) const {
  const auto& m = model();
  const auto values =
      internal::token_ids_on_cpu(ids, "lamp::data::BytePairEncoding::decode");
  const auto* p = values.data_ptr<int64_t>();
  std::string text;
  for (int64_t i = 0; i < values.size(0); ++i) {
    const int64_t id = p[i];
    if (id >= 0 && static_cast<size_t>(id) < m.tokens.size() &&
        m.has_token[static_cast<size_t>(id)]) {
      text += m.tokens[static_cast<size_t>(id)];
      continue;
    }
    const auto special = m.specials.find(id);
    if (special != m.specials.end()) {
      text += special->second;
      continue;
    }
    // "<id>", appended piece by piece: GCC 12 at -O2 warns, wrongly, of an
    // overflow in "<" + std::string.
    text += '<';
    text += std::to_string(id);
    text += '>';
  }
  return text;
}

} // namespace data
} // namespace lamp
