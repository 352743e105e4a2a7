"""Writes tests/python/byte_pair/*: a small byte-level BPE tokenizer (GPT-2's
kind) in each format lamp::data::BytePairEncoding reads, and the ids Python's
tokenizers give for a set of texts, for tests/byte_pair_test.cpp (which reads
the committed files, so the tests need no Python). Made with tokenizers
0.23.3 and tiktoken 0.14.0 on Python 3.11:

  python tests/python/make_byte_pair_files.py tests/python/byte_pair

The tokenizer is trained by Hugging Face's tokenizers on lamp's own docs
(docs/gpt.md as it was then), GPT-2's way: the ByteLevel pre-tokenizer
(GPT-2's split pattern, no prefix space), the 256 byte symbols as its
alphabet, 600 tokens in all with "<|endoftext|>" last (id 599, as GPT-2's
50256 is its last):

  tokenizer.json   Hugging Face's one-file form (tokenizer.save())
  vocab.json       the ids of the tokens, in GPT-2's byte-to-character map
  merges.txt       the merges, best first ("#version: 0.2" first, as
                   GPT-2's vocab.bpe and Hugging Face's merges.txt)
  tokens.tiktoken  tiktoken's form: each token's bytes in base64 and its id
                   (no special tokens: tiktoken holds those apart)
  expected.txt     for each text: a line "text HEX" (its UTF-8 bytes in
                   hex), a line "ids N N ..." as tiktoken's encode_ordinary
                   (GPT-2's pattern over the same tokens) encodes it, which
                   is also Hugging Face's encoding but where the text holds
                   "<|endoftext|>" (Hugging Face makes that the special
                   token, tiktoken and lamp keep it text); the script stops
                   if the two disagree elsewhere

The same for the other splits lamp knows (added later, trained on
docs/gpt.md as it was on 2026-12-04, so that running the script again
rewrites the GPT-2 files above from today's docs/gpt.md: keep the committed
ones), each a tokenizer of 600 tokens trained by a Split with its pattern, then ByteLevel
without one (as Llama 3's tokenizer.json):

  cl100k/          Llama 3's form of cl100k_base's pattern: tokenizer.json,
                   tokens.tiktoken, expected.txt (the ids tiktoken gives with
                   cl100k_base's own pattern, tiktoken 0.8's) and
                   expected_llama3.txt (with Llama 3's, which Hugging Face's
                   tokenizer also gives)
  o200k/           o200k_base's pattern: tokenizer.json, tokens.tiktoken,
                   expected.txt

expected_long.txt: as expected.txt, for LONG_TEXTS (pieces of thousands of
bytes, whose merges lamp orders in a heap), from the committed GPT-2 files:

  python tests/python/make_byte_pair_files.py --long tests/python/byte_pair

and splits.txt: for each split ("split NAME" lines: gpt2, cl100k, llama3,
o200k) and each text of TEXTS and SPLIT_TEXTS, a line "text HEX" and a
line "pieces HEX HEX ..." (each piece's UTF-8 bytes): the matches of the
split's pattern as Python's regex module (2026.11.19) finds them. The script
stops unless tiktoken, merging each piece alone, gives the ids it gives the
whole text, with each trained tokenizer.
"""

import base64
import json
import os
import sys

import regex
import tiktoken
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# tiktoken's pattern for GPT-2 (r50k_base): the same split as GPT-2's own
# "'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+".
GPT2_PATTERN = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++"""
                r"""| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""")

# cl100k_base's pattern as tiktoken 0.8 and later have it, and as Llama 3's
# tokenizer.json (and tiktoken before 0.8) write it, which Hugging Face's
# regex engine reads as tiktoken's regex does; o200k_base's.
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
                  r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
                  r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
SPLITS = [("gpt2", GPT2_PATTERN), ("cl100k", CL100K_PATTERN), ("llama3", LLAMA3_PATTERN),
          ("o200k", O200K_PATTERN)]

# What the split and the merges must get right: contractions (and what only
# looks like one), runs of spaces before words and at the end, newlines and
# tabs, digits beside letters, Unicode letters, digits and spaces
# (U+00A0, U+3000), marks, emoji, punctuation runs, the special token's text
# (ordinary text when encoding), and texts of one character or none.
TEXTS = [
    "",
    " ",
    "a",
    "Hello world",
    "hello  world   ",
    "  leading and trailing  \n",
    "line one\nline two\n\n\nline four\r\n",
    "\ttab\t\tseparated\t",
    "It's what we've done; they'll say I'm sure he'd've. 'quoted' 'S 'sx",
    "don't DON'T don’t",
    "x86_64 has 16 registers; 3.14159 and 1,000,000 and 2026-12-04",
    "mixed-precision (FP16/BF16) training: loss * scale -> grads / scale!!",
    "café naïve über Straße ÆØÅ",
    "Ελληνικά и русский текст",
    "日本語のテキスト、中文文本。",
    "non\u00a0breaking\u00a0space and\u3000ideographic space",
    "emoji 🙂🚀 and ZWJ 👩‍💻 sequences",
    "combining e\u0301 and n\u0303 marks",
    "١٢٣ Arabic digits and Ⅻ roman numeral and ½ fraction",
    "<|endoftext|> is text here",
    "--resume runs/gpt.pt --precision amp-bf16 --steps 5000",
    "    def f(x):\n        return x ** 2  # squared\n",
]


# What the other splits add: contractions in any case (and U+017F, long s,
# which folds to s), letters led by punctuation, a mark or white space,
# numbers cut in threes, line breaks and slashes after punctuation, white
# space with line breaks (ending the text too), and o200k_base's cased
# words: CamelCase, capitals then lower case, titlecase (U+01C5), modifier
# and other letters (U+02B0, U+3005, U+0640), marks leading and inside
# words (Devanagari).
SPLIT_TEXTS = [
    "'S 'T 'Ll 'VE 're 'D 'M x'S y'\u017f",
    "(hello) [World] \"quoted\" ...abc ,x",
    "1234567 12,345.67 99 bottles",
    "a!\n/b c/\r\nd ==\n\n",
    "ends with a break\n  ",
    "ends with breaks \n \n\t ",
    "\r\n\r\nwindows\r\n",
    "\tword\u00a0word\u3000word",
    "CamelCaseWord HTTPServer iPhone HELLOworld ALLCAPS",
    "\u01c5ungla \u02b0ello \u3005\u3005 \u0640\u0627\u0640",
    "\u0301abc e\u0301t\u00e9 \u0915\u093f\u0924\u093e\u092c",
    "don't DON'T They'RE we'Ve",
]


def long_texts():
    """Texts of one long piece each in GPT-2's split, whose merges are many:
    a run of one letter, a word of thousands of letters made of words (of
    lamp's docs' vocabulary, drawn with a fixed seed), a run of digits, of
    punctuation, and of spaces before a word."""
    import random
    draw = random.Random(7)
    words = ["precision", "training", "scale", "loss", "the", "gradient", "step",
             "master", "weights", "token", "model", "and", "of", "mixed", "half"]
    return [
        "a" * 3000,
        "".join(draw.choice(words) for _ in range(600)),
        "3141592653589793" * 150,
        "-=" * 900 + "!!?",
        " " * 2500 + "word",
    ]


def write_long(folder):
    """expected_long.txt from the committed GPT-2 files in `folder`."""
    ranks = {}
    with open(os.path.join(folder, "tokens.tiktoken"), encoding="ascii") as f:
        for line in f:
            token, id_ = line.split()
            ranks[base64.b64decode(token)] = int(id_)
    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    special = tokenizer.token_to_id("<|endoftext|>")
    twin = tiktoken.Encoding("fixture", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": special})
    write_expected(os.path.join(folder, "expected_long.txt"), twin, tokenizer, True,
                   long_texts())


def gpt2_bytes_to_unicode():
    """GPT-2's map of the 256 bytes onto printable characters."""
    printable = (list(range(ord("!"), ord("~") + 1)) +
                 list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars)))


def train(corpus, pre_tokenizer):
    """A byte-level BPE of 600 tokens, "<|endoftext|>" last, on `corpus`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=599, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tokenizer.train_from_iterator([corpus], trainer)
    tokenizer.add_special_tokens(["<|endoftext|>"])
    special = tokenizer.token_to_id("<|endoftext|>")
    assert special == tokenizer.get_vocab_size() - 1, special
    return tokenizer, special


def tiktoken_ranks(tokenizer):
    """The tokens' bytes and ids (tiktoken's ranks)."""
    model = json.loads(tokenizer.to_str())["model"]
    to_byte = {c: b for b, c in gpt2_bytes_to_unicode().items()}
    return {bytes(to_byte[c] for c in token): id_ for token, id_ in model["vocab"].items()}


def write_tiktoken(path, ranks):
    with open(path, "w", encoding="ascii") as f:
        for token, id_ in sorted(ranks.items(), key=lambda item: item[1]):
            f.write(base64.b64encode(token).decode("ascii") + " " + str(id_) + "\n")


def write_expected(path, twin, tokenizer, same_as_hugging_face, texts):
    """The ids `twin` (tiktoken) gives each of `texts`, checked against
    Hugging Face's `tokenizer` where `same_as_hugging_face`, and decoded."""
    with open(path, "w", encoding="ascii") as f:
        for text in texts:
            ids = twin.encode_ordinary(text)
            # Hugging Face's tokenizer turns the special token's text into
            # its id even then; tiktoken's encode_ordinary (nanoGPT's
            # prepare.py) and lamp keep text as text.
            if same_as_hugging_face and "<|endoftext|>" not in text:
                assert ids == tokenizer.encode(text, add_special_tokens=False).ids, text
            assert tokenizer.decode(ids) == text, text
            f.write("text " + text.encode("utf-8").hex() + "\n")
            f.write("ids" + "".join(" " + str(i) for i in ids) + "\n")


def main(folder):
    os.makedirs(folder, exist_ok=True)
    path = lambda name: os.path.join(folder, name)
    with open(os.path.join(ROOT, "docs", "gpt.md"), encoding="utf-8") as f:
        corpus = f.read()

    tokenizer, special = train(corpus, pre_tokenizers.ByteLevel(add_prefix_space=False))
    tokenizer.save(path("tokenizer.json"))

    model = json.loads(tokenizer.to_str())["model"]
    vocab = dict(model["vocab"])
    vocab["<|endoftext|>"] = special
    with open(path("vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    with open(path("merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")

    ranks = tiktoken_ranks(tokenizer)
    write_tiktoken(path("tokens.tiktoken"), ranks)
    twin = tiktoken.Encoding("fixture", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": special})

    # The GPT-2 fixture's texts are TEXTS alone (expected.txt as it was).
    write_expected(path("expected.txt"), twin, tokenizer, True, TEXTS)
    twins = {"gpt2": twin}

    # The other splits: a Split by the pattern, then ByteLevel without one.
    for name, pattern, outputs in [
            ("cl100k", LLAMA3_PATTERN, [("expected.txt", CL100K_PATTERN, False),
                                        ("expected_llama3.txt", LLAMA3_PATTERN, True)]),
            ("o200k", O200K_PATTERN, [("expected.txt", O200K_PATTERN, True)])]:
        sub = os.path.join(folder, name)
        os.makedirs(sub, exist_ok=True)
        split = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        trained, special = train(corpus, split)
        trained.save(os.path.join(sub, "tokenizer.json"))
        ranks = tiktoken_ranks(trained)
        write_tiktoken(os.path.join(sub, "tokens.tiktoken"), ranks)
        for expected, twin_pattern, same in outputs:
            twin = tiktoken.Encoding(name, pat_str=twin_pattern, mergeable_ranks=ranks,
                                     special_tokens={"<|endoftext|>": special})
            write_expected(os.path.join(sub, expected), twin, trained, same,
                           TEXTS + SPLIT_TEXTS)
            twins[dict((p, n) for n, p in SPLITS)[twin_pattern]] = twin

    # The pieces, as Python's regex module finds them; each split's trained
    # tokenizer in tiktoken gives the text's ids merging them one by one.
    with open(path("splits.txt"), "w", encoding="ascii") as f:
        for name, pattern in SPLITS:
            f.write("split " + name + "\n")
            for text in TEXTS + SPLIT_TEXTS:
                pieces = regex.findall(pattern, text)
                assert "".join(pieces) == text, (name, text)
                twin = twins[name]
                merged = [i for p in pieces for i in twin._encode_bytes(p.encode("utf-8"))]
                assert merged == twin.encode_ordinary(text), (name, text)
                f.write("text " + text.encode("utf-8").hex() + "\n")
                f.write("pieces" + "".join(" " + p.encode("utf-8").hex() for p in pieces) + "\n")
    print("wrote", folder, "with", len(TEXTS), "texts and", len(SPLIT_TEXTS), "more for the",
          "splits,", tokenizer.get_vocab_size(), "tokens each")


if __name__ == "__main__":
    if sys.argv[1] == "--long":
        write_long(sys.argv[2])
    else:
        main(sys.argv[1])
