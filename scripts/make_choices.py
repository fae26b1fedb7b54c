#!/usr/bin/env python3
"""Write multiple-choice evaluation files for `colossal_eval --choices` (and eval.choices).

The format is llm.c's (dev/data/data_common.py's write_evalfile), so files made by llm.c's
dev/data/hellaswag.py are read too: a header of 256 little-endian int32 (magic 20240522,
version 1, the number of examples, the longest example in bytes), then each example as
little-endian uint16 values: 65535, the example's size in bytes, its index, its label, the
number of completions, the context's length and tokens, then each completion's length and
tokens. Token ids must be below 65535: GPT-2 and OPT vocabularies, not Llama 3's.

Two sources:
  hellaswag JSONL    HellaSwag's hellaswag_val.jsonl (github.com/rowanz/hellaswag; copy it
                     here, nothing is downloaded): each line's "ctx" is the context, " " + each
                     of its "endings" a completion, "label" the right one, as llm.c renders
                     them. Tokenized with --tokenizer (a tokenizer.json, read as
                     scripts/tokenize.py reads it) or tiktoken's cached GPT-2 encoding.
  text FILE          continuations of a text, for byte-level models (the quickstart): each
                     example's context is a span of the text, its right completion the bytes
                     that follow, the others spans of the same length from elsewhere.

Examples:
  python3 scripts/make_choices.py hellaswag hellaswag_val.jsonl \\
      --tokenizer hf/gpt2/tokenizer.json --out data/hellaswag_val.bin
  python3 scripts/make_choices.py text data/licenses_val.txt --out data/licenses_choices.bin
  build/bin/colossal_eval configs/quickstart.yaml --weights runs/quickstart/model.h5 \\
      --choices data/licenses_choices.bin
"""

import argparse
import importlib.util
import json
import os
import random
import struct
import sys
from array import array

MAGIC, VERSION = 20240522, 1
HEADER_INTS = 256
START = 65535  # starts each example; ids must stay below it


class ChoicesError(Exception):
    """A problem the user can fix; printed without a traceback, exit code 2."""


def encode_file(examples):
    """The file's bytes for examples of (index, label, context ids, [completion ids, ...])."""
    if not 0 < len(examples) < 65536:
        raise ChoicesError(f"the format holds 1 to 65535 examples, not {len(examples)}")
    body = array("H")
    longest = 0
    for index, label, context, completions in examples:
        values = [START, 0, index, label, len(completions), len(context), *context]
        for c in completions:
            values += [len(c), *c]
        bad = [v for v in values[2:] if not 0 <= v < START]
        if bad:
            raise ChoicesError(f"example {index}: the value {bad[0]} does not fit the format's "
                               "uint16 values below 65535 (a token id of a vocabulary larger "
                               "than 65535, or a context or completion that long?)")
        if not 0 <= label < len(completions) or len(completions) < 2:
            raise ChoicesError(f"example {index}: label {label} of {len(completions)} completions")
        if not context or not all(completions):
            raise ChoicesError(f"example {index}: an empty context or completion")
        size = 2 * len(values)
        if size >= START:
            raise ChoicesError(f"example {index} is {size} bytes; the format's limit is 65534")
        values[1] = size
        longest = max(longest, size)
        body.extend(values)
    header = [MAGIC, VERSION, len(examples), longest] + [0] * (HEADER_INTS - 4)
    if sys.byteorder != "little":
        body.byteswap()
    return struct.pack(f"<{HEADER_INTS}i", *header) + body.tobytes()


def read_file(path):
    """[(index, label, context ids, [completion ids, ...])] of a file in this format (for tools
    and tests in Python; colossal reads it with io::parse_choice_file, which checks it)."""
    data = open(path, "rb").read()
    magic, version, count = struct.unpack_from("<3i", data, 0)
    if (magic, version) != (MAGIC, VERSION):
        raise ChoicesError(f"'{path}' is not a multiple-choice file (magic {magic}, version "
                           f"{version})")
    values = array("H", data[HEADER_INTS * 4:])
    if sys.byteorder != "little":
        values.byteswap()
    at, examples = 0, []
    for _ in range(count):
        index, label, n = values[at + 2], values[at + 3], values[at + 4]
        p = at + 5
        runs = []
        for _ in range(n + 1):  # the context, then each completion
            runs.append(list(values[p + 1:p + 1 + values[p]]))
            p += 1 + values[p]
        examples.append((index, label, runs[0], runs[1:]))
        at += values[at + 1] // 2
    return examples


def load_module(name):
    """A sibling script as a module (tokenize.py's name shadows Python's own `tokenize`)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location("colossal_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_tokenize_module():
    """scripts/tokenize.py's tokenizer loaders."""
    return load_module("tokenize")


def hellaswag_examples(path, tok, limit):
    examples = []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        raise ChoicesError(f"cannot read '{path}': {e.strerror}; give HellaSwag's "
                           "hellaswag_val.jsonl (github.com/rowanz/hellaswag, data/)")
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            items.append((item["ctx"], list(item["endings"]), int(item["label"])))
        except (ValueError, KeyError, TypeError) as e:
            raise ChoicesError(f"'{path}' line {number}: not a HellaSwag item with \"ctx\", "
                               f"\"endings\" and \"label\" ({e})")
        if limit and len(items) == limit:
            break
    if not items:
        raise ChoicesError(f"'{path}' holds no HellaSwag items")
    texts = []
    for ctx, endings, _ in items:
        texts.append(ctx)
        texts.extend(" " + e for e in endings)  # each ending after a space, as llm.c renders it
    ids = tok.encode_batch(texts)
    at = 0
    for index, (ctx, endings, label) in enumerate(items):
        context = ids[at]
        completions = ids[at + 1:at + 1 + len(endings)]
        at += 1 + len(endings)
        examples.append((index, label, context, completions))
    return examples


def text_examples(path, count, context, completion, choices, seed):
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise ChoicesError(f"cannot read '{path}': {e.strerror}")
    span = context + completion
    if len(data) < 4 * span:
        raise ChoicesError(f"'{path}' has {len(data)} bytes, fewer than 4 x {span} (context + "
                           "completion): use a longer text, or a shorter --context")
    rng = random.Random(seed)
    examples = []
    for index in range(count):
        start = rng.randrange(0, len(data) - span)
        right = list(data[start + context:start + span])
        label = rng.randrange(choices)
        completions = []
        for c in range(choices):
            if c == label:
                completions.append(right)
                continue
            for _ in range(1000):  # a span of the text elsewhere, never the right one's bytes
                other = rng.randrange(0, len(data) - completion)
                wrong = list(data[other:other + completion])
                if abs(other - (start + context)) >= completion and wrong != right:
                    break
            else:
                raise ChoicesError(f"'{path}' is too repetitive: no span of {completion} bytes "
                                   f"differs from example {index}'s right completion; use "
                                   "another text or a longer --completion")
            completions.append(wrong)
        examples.append((index, label, list(data[start:start + context]), completions))
    return examples


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module's docstring (head -30 scripts/make_choices.py) for the format.")
    sub = parser.add_subparsers(dest="source", required=True)
    hs = sub.add_parser("hellaswag", help="HellaSwag's jsonl, tokenized")
    hs.add_argument("jsonl")
    hs.add_argument("--tokenizer", help="a tokenizer.json or a folder holding one (default: "
                    "tiktoken's GPT-2 encoding, if cached)")
    hs.add_argument("--limit", type=int, default=0, help="only the first N items")
    hs.add_argument("--out", required=True)
    tx = sub.add_parser("text", help="continuations of a text, byte-level")
    tx.add_argument("file")
    tx.add_argument("--examples", type=int, default=500)
    tx.add_argument("--context", type=int, default=64, help="bytes of context (default 64)")
    tx.add_argument("--completion", type=int, default=16, help="bytes per completion (16)")
    tx.add_argument("--choices", type=int, default=4, help="completions per example (4)")
    tx.add_argument("--seed", type=int, default=0)
    tx.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        if args.source == "hellaswag":
            tokenize = load_tokenize_module()
            try:
                tok = tokenize.choose_tokenizer(args)
            except tokenize.TokenizeError as e:
                raise ChoicesError(str(e))
            if tok.vocab_size > START:
                raise ChoicesError(f"{tok.name} has {tok.vocab_size} ids; the multiple-choice "
                                   "format holds ids below 65535 (GPT-2 and OPT vocabularies)")
            examples = hellaswag_examples(args.jsonl, tok, args.limit)
            what = f"HellaSwag items tokenized with {tok.name}"
        else:
            for name in ("examples", "context", "completion"):
                if getattr(args, name) < 1:
                    raise ChoicesError(f"--{name} must be at least 1")
            if args.choices < 2:
                raise ChoicesError("--choices must be at least 2")
            examples = text_examples(args.file, args.examples, args.context, args.completion,
                                     args.choices, args.seed)
            what = "byte-level continuations"
        data = encode_file(examples)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, args.out)  # never a partial file under the final name
    except ChoicesError as e:
        print(f"make_choices.py: {e}", file=sys.stderr)
        return 2
    completions = sum(len(e[3]) for e in examples)
    print(f"wrote {len(examples)} examples ({completions} completions; {what}) to {args.out} "
          f"({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
