#!/usr/bin/env python3
"""scripts/tokenize.py end to end: a byte-level BPE tokenizer.json trained here (no network), a
small folder of text tokenized into train.bin/val.bin, and io::TokenFile (through token_dump)
reading back exactly the tokens the tokenizer gives for those texts. Also: a vocabulary above
65536 is written as uint32 tokens (llm.c's llama-3 files) and read back, a missing --tokenizer
is named, and with no tokenizer package the message says
what to install. Exits 77 (skipped) when the `tokenizers` package is not importable.

Environment: COLOSSAL_SOURCE_DIR (the repository), COLOSSAL_TOKEN_DUMP (the token_dump program).
"""

import json
import os
import subprocess
import sys
import tempfile

try:
    import tokenizers
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
except ImportError:
    print("skipped: the `tokenizers` package is not importable")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("COLOSSAL_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
SCRIPT = os.path.join(SOURCE, "scripts", "tokenize.py")
DUMP = os.environ.get("COLOSSAL_TOKEN_DUMP", "token_dump")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def run(args, block=()):
    """tokenize.py ARGS in a fresh interpreter, with the modules in `block` made unimportable."""
    code = ("import runpy, sys\n"
            f"for m in {list(block)!r}: sys.modules[m] = None\n"
            f"sys.argv = ['tokenize.py'] + {list(args)!r}\n"
            f"runpy.run_path({SCRIPT!r}, run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def read_back(path, want_format="llmc_uint16"):
    out = subprocess.run([DUMP, path], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"token_dump {path} failed: {out.stderr}")
    lines = out.stdout.split("\n")
    count, fmt = lines[0].split()
    tokens = [int(t) for t in lines[1:] if t]
    check(fmt == want_format, f"{path} read as {fmt}")
    check(int(count) == len(tokens), f"{path}: count {count} but {len(tokens)} tokens")
    return tokens


with tempfile.TemporaryDirectory() as tmp:
    corpus = os.path.join(tmp, "corpus")
    os.makedirs(os.path.join(corpus, "b"))
    texts = {
        "a.txt": "The quick brown fox jumps over the lazy dog.\nColossal trains GPT-2.\n" * 20,
        "b/c.txt": "Pipelines, tensors and ZeRO: parallel training, one step at a time. " * 30,
        "b/d.txt": "Unicode too: naïve café, 東京, emoji 🙂.\n" * 10,
        "skip.md": "not a .txt file: left out",
    }
    for name, text in texts.items():
        with open(os.path.join(corpus, name), "w", encoding="utf-8") as f:
            f.write(text)

    # A byte-level BPE like GPT-2's, trained on the corpus, with <|endoftext|>.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        list(texts.values()),
        trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok_path = os.path.join(tmp, "tokenizer.json")
    tok.save(tok_path)
    eot = tok.token_to_id("<|endoftext|>")

    out = os.path.join(tmp, "out")
    r = run([corpus, "--tokenizer", tok_path, "--out", out, "--val-fraction", "0.25"])
    check(r.returncode == 0, f"tokenize.py failed: {r.stderr}")
    print(r.stdout.strip())
    # Expected: the .txt files in sorted path order, each after an end-of-text token.
    expected = []
    for name in sorted(n for n in texts if n.endswith(".txt")):
        expected.append(eot)
        expected.extend(tok.encode(texts[name], add_special_tokens=False).ids)
    n_val = int(round(len(expected) * 0.25))
    train = read_back(os.path.join(out, "train.bin"))
    val = read_back(os.path.join(out, "val.bin"))
    check(train == expected[:len(expected) - n_val], "train.bin holds other tokens")
    check(val == expected[len(expected) - n_val:], "val.bin holds other tokens")
    check(len(val) > 0 and len(train) > 3 * len(val) - 2, f"split {len(train)}/{len(val)}")
    check(f"set model.vocab >= {tok.get_vocab_size()}" in r.stdout, "no model.vocab hint")
    # The text round-trips through the tokens (a real BPE, not bytes).
    check(tok.decode(train[1:1 + len(tok.encode(texts['a.txt']).ids)]) == texts["a.txt"],
          "decoded train.bin differs from a.txt")
    check(len(expected) < sum(len(t.encode()) for n, t in texts.items() if n.endswith(".txt")),
          "the BPE did not merge anything")

    # --encode / --decode: a prompt's ids for colossal_generate over token files, and back.
    text = "The quick brown fox"
    r = run(["--tokenizer", tok_path, "--encode", text])
    ids = tok.encode(text, add_special_tokens=False).ids
    check(r.returncode == 0 and r.stdout.strip() == " ".join(map(str, ids)),
          f"--encode: {r.returncode} {r.stdout} {r.stderr}")
    r = run(["--tokenizer", tok_path, "--decode", " ".join(map(str, ids))])
    check(r.returncode == 0 and r.stdout.rstrip("\n") == text, f"--decode: {r.stdout} {r.stderr}")
    r = run(["--tokenizer", tok_path, "--decode", "12 99999"])
    check(r.returncode == 2 and "id 99999 is outside" in r.stderr, f"--decode 99999: {r.stderr}")
    r = run(["--tokenizer", tok_path, "--decode", "12 x"])
    check(r.returncode == 2 and "is not token ids" in r.stderr, f"--decode x: {r.stderr}")
    r = run([corpus, "--tokenizer", tok_path, "--encode", text])
    check(r.returncode == 2 and "take no inputs" in r.stderr, f"--encode with inputs: {r.stderr}")

    # --val-fraction 0: no val.bin.
    out0 = os.path.join(tmp, "out0")
    r = run([os.path.join(corpus, "a.txt"), "--tokenizer", tmp, "--out", out0,
             "--val-fraction", "0"])
    check(r.returncode == 0, f"--val-fraction 0 failed: {r.stderr}")
    check(not os.path.exists(os.path.join(out0, "val.bin")), "val.bin written for fraction 0")
    check(read_back(os.path.join(out0, "train.bin")) ==
          [eot] + tok.encode(texts["a.txt"]).ids, "one file, folder --tokenizer")

    # A vocabulary above 65536 (Llama 3's 128256): uint32 tokens after llm.c's llama-3 header,
    # each document after <|begin_of_text|> where there is no <|endoftext|>.
    big = {"[UNK]": 0}
    big.update({f"w{i}": i + 1 for i in range(65536)})
    big["<|begin_of_text|>"] = 65537
    wide = Tokenizer(models.WordLevel(vocab=big, unk_token="[UNK]"))
    wide.pre_tokenizer = pre_tokenizers.Whitespace()
    wide.add_special_tokens(["<|begin_of_text|>"])
    wide_path = os.path.join(tmp, "wide.json")
    wide.save(wide_path)
    wide_dir = os.path.join(tmp, "wide")
    words = os.path.join(tmp, "words.txt")
    with open(words, "w") as f:
        f.write("w1 w70000 w65535 w3")  # 70000 is no word: [UNK] (0)
    r = run([words, "--tokenizer", wide_path, "--out", wide_dir, "--val-fraction", "0"])
    check(r.returncode == 0 and "uint32 tokens" in r.stdout, f"wide vocabulary: {r.stderr}")
    check(read_back(os.path.join(wide_dir, "train.bin"), "llmc_uint32") ==
          [65537, 2, 0, 65536, 4], "uint32 tokens read back")

    # A missing tokenizer file, and no tokenizer package at all, are named.
    r = run([corpus, "--tokenizer", os.path.join(tmp, "nope.json"), "--out", out])
    check(r.returncode == 2 and "nope.json' does not exist" in r.stderr, f"missing: {r.stderr}")
    r = run([corpus, "--out", out], block=["tiktoken", "tokenizers", "transformers"])
    check(r.returncode == 2 and "no tokenizer available" in r.stderr and
          "--tokenizer PATH" in r.stderr, f"none available: {r.stderr}")
    r = run([corpus, "--tokenizer", tok_path, "--out", out], block=["tokenizers", "transformers"])
    check(r.returncode == 2 and "pip install tokenizers" in r.stderr, f"no package: {r.stderr}")
    r = run(["--help"])
    check(r.returncode == 0 and "--tokenizer" in r.stdout and "train.bin" in r.stdout,
          "--help")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all tokenize.py checks passed")
