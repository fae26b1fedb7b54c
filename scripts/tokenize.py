#!/usr/bin/env python3
"""Turn text files (or folders of them) into llm.c token files for colossal_train.

Writes OUT/train.bin and OUT/val.bin in the layout io/dataset.hpp reads: a header of 256
little-endian int32 (magic, version, token count, the rest 0), then the tokens: little-endian
uint16 (magic 20240520, version 1) for vocabularies up to 65536 tokens, little-endian uint32
(llm.c's llama-3 files: magic 20240801, version 7) for larger ones, such as Llama 3's 128256.
Every document (one file) is preceded by the end-of-text token <|endoftext|> (or, where the
tokenizer has none, Llama 3's <|begin_of_text|>), as llm.c's data scripts do, so the model sees
where documents start. The token stream is split by --val-fraction: the first part is
train.bin, the last val.bin.

The tokenizer, in this order:
  --tokenizer PATH   a Hugging Face tokenizer.json (or a folder holding one), read with the
                     `tokenizers` package, or else with transformers' PreTrainedTokenizerFast;
  otherwise          GPT-2's BPE from `tiktoken`, if it is installed and its encoding is already
                     in its cache (this script never downloads: there may be no network).

Example (a folder of .txt files to training data for a GPT-2 sized model):
  python3 scripts/tokenize.py corpus/ --tokenizer gpt2/tokenizer.json --out data/corpus
  colossal_train configs/gpt2-124m.yaml --set data.path=data/corpus/train.bin \\
      --set data.val_path=data/corpus/val.bin

colossal has no tokenizer of its own: over token files its prompts (colossal_generate --prompt,
sample.prompt) and samples are token ids. --encode TEXT prints the ids of TEXT and --decode IDS
the text of ids, with the same tokenizer:
  python3 scripts/tokenize.py --tokenizer gpt2/tokenizer.json --encode "The licence"
  colossal_generate configs/gpt2-124m.yaml --weights runs/corpus/model.h5 --prompt "464 17098"
  python3 scripts/tokenize.py --tokenizer gpt2/tokenizer.json --decode "464 17098 ..."
"""

import argparse
import hashlib
import os
import struct
import sys
from array import array

MAGIC, VERSION = 20240520, 1        # uint16 tokens: ids 0 .. 65535
MAGIC32, VERSION32 = 20240801, 7    # uint32 tokens (llm.c's llama-3 files)
HEADER_INTS = 256
MAX_VOCAB16 = 65535
# The document separator: GPT-2's end-of-text, else Llama 3's begin-of-text.
SEPARATORS = ["<|endoftext|>", "<|begin_of_text|>"]

# tiktoken's GPT-2 encoding files; tiktoken caches each under the SHA-1 of its URL.
TIKTOKEN_GPT2_URLS = [
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
]


class TokenizeError(Exception):
    """A problem the user can fix; printed without a traceback, exit code 2."""


class Tokenizer:
    """The few things this script needs of a tokenizer."""

    def __init__(self, name, vocab_size, eot, encode_batch, decode):
        self.name = name
        self.vocab_size = vocab_size  # the largest id + 1: model.vocab must reach it
        self.eot = eot  # the end-of-text id, or None
        self.encode_batch = encode_batch  # list of str -> list of list of int
        self.decode = decode  # list of int -> str


def tiktoken_cache_dir():
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    import tempfile

    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def tiktoken_gpt2():
    """GPT-2's encoding from tiktoken when it needs no download; else (None, why)."""
    try:
        import tiktoken
    except ImportError:
        return None, "the tiktoken package is not installed"
    cache = tiktoken_cache_dir()
    for url in TIKTOKEN_GPT2_URLS:
        cached = os.path.join(cache, hashlib.sha1(url.encode()).hexdigest())
        if not os.path.isfile(cached):
            return None, ("tiktoken is installed but its gpt2 encoding is not in its cache "
                          f"({cache}); it would need a download")
    enc = tiktoken.get_encoding("gpt2")
    return Tokenizer("tiktoken gpt2", enc.n_vocab, enc.eot_token,
                     lambda texts: enc.encode_ordinary_batch(texts), enc.decode), ""


def local_tokenizer(path):
    """A tokenizer.json (or a folder with one) through `tokenizers`, else transformers."""
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise TokenizeError(f"--tokenizer: '{path}' does not exist (give a tokenizer.json, "
                            "or a folder holding one)")
    try:
        from tokenizers import Tokenizer as HfTokenizer
    except ImportError:
        HfTokenizer = None
    if HfTokenizer is not None:
        try:
            tok = HfTokenizer.from_file(path)
        except Exception as e:  # the package's own message says what is wrong in the file
            raise TokenizeError(f"--tokenizer: cannot read '{path}': {e}")

        def encode(texts):
            return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

        found = [tok.token_to_id(t) for t in SEPARATORS if tok.token_to_id(t) is not None]
        # The largest id + 1, not the count: added tokens' ids may leave gaps.
        vocab = max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        return Tokenizer(f"tokenizers {path}", vocab,
                         found[0] if found else None, encode,
                         lambda ids: tok.decode(ids, skip_special_tokens=False))
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise TokenizeError("--tokenizer needs the `tokenizers` package (pip install tokenizers) "
                            "or `transformers` to read a tokenizer.json; neither is installed")
    try:
        tok = PreTrainedTokenizerFast(tokenizer_file=path)
    except Exception as e:
        raise TokenizeError(f"--tokenizer: cannot read '{path}': {e}")
    eot = None
    for text in SEPARATORS:
        found = tok.convert_tokens_to_ids(text)
        if found is not None and found != tok.unk_token_id:
            eot = found
            break
    return Tokenizer(f"transformers {path}", max(tok.get_vocab().values(), default=-1) + 1,
                     eot, lambda texts: [tok(t, add_special_tokens=False)["input_ids"]
                                         for t in texts], tok.decode)


def choose_tokenizer(args):
    if args.tokenizer:
        return local_tokenizer(args.tokenizer)
    tok, why = tiktoken_gpt2()
    if tok is None:
        raise TokenizeError(
            "no tokenizer available: " + why + ". Give a local Hugging Face tokenizer.json with "
            "--tokenizer PATH (e.g. the tokenizer.json of a GPT-2 or OPT download, read with "
            "`pip install tokenizers`), or install tiktoken and put its gpt2 encoding in "
            "TIKTOKEN_CACHE_DIR. Nothing is downloaded at run time.")
    return tok


def input_files(paths, extensions):
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs.sort()
                for name in sorted(names):
                    if not extensions or os.path.splitext(name)[1] in extensions:
                        found.append(os.path.join(root, name))
            if not found:
                raise TokenizeError(f"'{path}' holds no files ending in {', '.join(extensions)} "
                                    "(--ext selects others)")
            files.extend(found)
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise TokenizeError(f"'{path}' does not exist")
    return files


def write_tokens(path, tokens, wide):
    if len(tokens) > 2**31 - 1:
        raise TokenizeError(f"{path}: {len(tokens)} tokens do not fit the header's int32 count; "
                            "split the corpus")
    header = [0] * HEADER_INTS
    header[0], header[1] = (MAGIC32, VERSION32) if wide else (MAGIC, VERSION)
    header[2] = len(tokens)
    data = array("I" if wide else "H", tokens)
    assert data.itemsize == (4 if wide else 2)
    if sys.byteorder != "little":
        data.byteswap()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        data.tofile(f)
    os.replace(tmp, path)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="tokenize.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", help="text files, or folders searched recursively")
    parser.add_argument("--out", help="folder for train.bin and val.bin")
    parser.add_argument("--encode", metavar="TEXT",
                        help="instead, print TEXT's token ids (a prompt for colossal_generate "
                             "--prompt or sample.prompt over token files)")
    parser.add_argument("--decode", metavar="IDS",
                        help="instead, print the text of token ids separated by spaces (what "
                             "colossal_generate prints over token files)")
    parser.add_argument("--tokenizer", help="a tokenizer.json, or a folder holding one")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="share of the tokens (the last ones) that go to val.bin; 0 writes "
                             "no val.bin (default 0.1)")
    parser.add_argument("--ext", default=".txt",
                        help="comma-separated endings of the files taken from folders "
                             "(default .txt; '' takes every file)")
    parser.add_argument("--no-eot", action="store_true",
                        help="do not put the end-of-text token before each document")
    args = parser.parse_args(argv)
    try:
        if args.encode is not None or args.decode is not None:
            if args.inputs or args.out or (args.encode is not None and args.decode is not None):
                raise TokenizeError("--encode and --decode take no inputs, no --out and not "
                                    "each other")
            tok = choose_tokenizer(args)
            if args.encode is not None:
                print(" ".join(str(i) for i in tok.encode_batch([args.encode])[0]))
                return 0
            try:
                ids = [int(t) for t in args.decode.replace(",", " ").split()]
            except ValueError:
                raise TokenizeError(f"--decode: '{args.decode}' is not token ids separated by "
                                    "spaces")
            outside = [i for i in ids if not 0 <= i < tok.vocab_size]
            if outside:
                raise TokenizeError(f"--decode: id {outside[0]} is outside the tokenizer's "
                                    f"vocabulary (0 to {tok.vocab_size - 1})")
            print(tok.decode(ids))
            return 0
        if not args.inputs or not args.out:
            raise TokenizeError("give text files or folders and --out FOLDER (or --encode / "
                                "--decode); see --help")
        if not 0.0 <= args.val_fraction < 1.0:
            raise TokenizeError(f"--val-fraction {args.val_fraction} is outside [0, 1)")
        extensions = [e if e.startswith(".") else "." + e for e in args.ext.split(",") if e]
        files = input_files(args.inputs, extensions)
        tok = choose_tokenizer(args)
        wide = tok.vocab_size > MAX_VOCAB16 + 1  # uint32 tokens (llm.c's llama-3 layout)
        eot = None if args.no_eot else tok.eot
        if eot is None and not args.no_eot:
            print(f"tokenize.py: note: the tokenizer has none of {', '.join(SEPARATORS)}; "
                  "documents are joined without a separator", file=sys.stderr)
        tokens = array("I" if wide else "H")
        for start in range(0, len(files), 64):
            batch = files[start:start + 64]
            texts = []
            for path in batch:
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
            for path, ids in zip(batch, tok.encode_batch(texts)):
                if eot is not None:
                    tokens.append(eot)
                if ids and not wide and max(ids) > MAX_VOCAB16:
                    raise TokenizeError(f"{path}: token id {max(ids)} does not fit uint16 (the "
                                        f"tokenizer says it has {tok.vocab_size} tokens)")
                tokens.extend(ids)
        if len(tokens) < 2:
            raise TokenizeError("the inputs hold fewer than 2 tokens")
        n_val = int(round(len(tokens) * args.val_fraction))
        n_train = len(tokens) - n_val
        os.makedirs(args.out, exist_ok=True)
        train_path = os.path.join(args.out, "train.bin")
        write_tokens(train_path, tokens[:n_train], wide)
        written = [f"{train_path} ({n_train} tokens)"]
        if n_val > 0:
            val_path = os.path.join(args.out, "val.bin")
            write_tokens(val_path, tokens[n_train:], wide)
            written.append(f"{val_path} ({n_val} tokens)")
        print(f"tokenize.py: {len(files)} files, {len(tokens)} tokens with {tok.name} "
              f"(vocabulary {tok.vocab_size}; set model.vocab >= {tok.vocab_size}; "
              f"{'uint32' if wide else 'uint16'} tokens): " + ", ".join(written))
        return 0
    except TokenizeError as e:
        print(f"tokenize.py: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"tokenize.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
