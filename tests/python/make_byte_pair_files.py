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
"""

import base64
import json
import os
import sys

import tiktoken
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# tiktoken's pattern for GPT-2 (r50k_base): the same split as GPT-2's own
# "'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+".
GPT2_PATTERN = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++"""
                r"""| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""")

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


def main(folder):
    os.makedirs(folder, exist_ok=True)
    path = lambda name: os.path.join(folder, name)
    with open(os.path.join(ROOT, "docs", "gpt.md"), encoding="utf-8") as f:
        corpus = f.read()

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=599, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tokenizer.train_from_iterator([corpus], trainer)
    tokenizer.add_special_tokens(["<|endoftext|>"])
    special = tokenizer.token_to_id("<|endoftext|>")
    assert special == tokenizer.get_vocab_size() - 1, special
    tokenizer.save(path("tokenizer.json"))

    model = json.loads(tokenizer.to_str())["model"]
    vocab = dict(model["vocab"])
    vocab["<|endoftext|>"] = special
    with open(path("vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    with open(path("merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")

    to_byte = {c: b for b, c in gpt2_bytes_to_unicode().items()}
    ranks = {}
    for token, id_ in model["vocab"].items():
        ranks[bytes(to_byte[c] for c in token)] = id_
    with open(path("tokens.tiktoken"), "w", encoding="ascii") as f:
        for token, id_ in sorted(ranks.items(), key=lambda item: item[1]):
            f.write(base64.b64encode(token).decode("ascii") + " " + str(id_) + "\n")
    twin = tiktoken.Encoding("fixture", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": special})

    with open(path("expected.txt"), "w", encoding="ascii") as f:
        for text in TEXTS:
            ids = twin.encode_ordinary(text)
            # Hugging Face's tokenizer turns the special token's text into
            # its id even then; tiktoken's encode_ordinary (nanoGPT's
            # prepare.py) and lamp keep text as text.
            if "<|endoftext|>" not in text:
                assert ids == tokenizer.encode(text, add_special_tokens=False).ids, text
            assert tokenizer.decode(ids) == text, text
            f.write("text " + text.encode("utf-8").hex() + "\n")
            f.write("ids" + "".join(" " + str(i) for i in ids) + "\n")
    print("wrote", folder, "with", len(TEXTS), "texts,", tokenizer.get_vocab_size(),
          "tokens")


if __name__ == "__main__":
    main(sys.argv[1])
