#!/usr/bin/env python3
"""scripts/make_choices.py end to end, read back by io::read_choice_file (through token_dump
--choices):
- `text`: byte-level continuations of a text: each example's context is in the text, followed
  there by its labelled completion; the other completions are spans of the text that differ
  from it; the same seed gives the same file;
- `hellaswag`: a HellaSwag-style jsonl tokenized with a byte-level BPE trained here (no
  network): the context's ids are the tokenizer's for "ctx", each completion's for
  " " + ending; skipped when the `tokenizers` package is not importable;
- bad input (too few completions, a context longer than the text allows, a text with no span
  unlike the right completion, a missing tokenizer, a broken jsonl line) gives a message and
  exit code 2, and never a file.

Environment: COLOSSAL_SOURCE_DIR (the repository), COLOSSAL_TOKEN_DUMP (the token_dump program).
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("COLOSSAL_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
SCRIPT = os.path.join(SOURCE, "scripts", "make_choices.py")
DUMP = os.environ.get("COLOSSAL_TOKEN_DUMP", "token_dump")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def read_back(path):
    """[(index, label, context, [completion, ...])] as the C++ reader sees them."""
    out = subprocess.run([DUMP, "--choices", path], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"token_dump --choices {path} failed: {out.stderr}")
    examples = []
    for line in out.stdout.splitlines():
        head, *runs = line.split(" | ")
        index, label = map(int, head.split())
        ids = [[int(t) for t in r.split()] for r in runs]
        examples.append((index, label, ids[0], ids[1:]))
    return examples


with tempfile.TemporaryDirectory() as tmp:
    text = ("Permission is hereby granted, free of charge, to any person obtaining a copy of "
            "this software. The above copyright notice shall be included in all copies. ") * 8
    text_path = os.path.join(tmp, "text.txt")
    with open(text_path, "w") as f:
        f.write(text)
    data = text.encode()
    out = os.path.join(tmp, "text.bin")
    r = run("text", text_path, "--out", out, "--examples", "40", "--context", "20",
            "--completion", "6", "--choices", "3", "--seed", "5")
    check(r.returncode == 0, f"text: exit {r.returncode}: {r.stderr}")
    check("wrote 40 examples (120 completions" in r.stdout, f"text: said {r.stdout!r}")
    examples = read_back(out)
    check(len(examples) == 40, f"text: {len(examples)} examples read back")
    # The script's own reader (bench/choices_peer.py's, test_hf_reference.py's) agrees.
    spec = importlib.util.spec_from_file_location("make_choices", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    check(module.read_file(out) == examples, "make_choices.read_file differs from the C++ reader")
    for index, label, context, completions in examples:
        check(len(context) == 20 and len(completions) == 3 and 0 <= label < 3,
              f"text example {index}: shape")
        right = bytes(context + completions[label])
        check(right in data, f"text example {index}: context + right completion not in the text")
        for k, c in enumerate(completions):
            check(len(c) == 6 and bytes(c) in data, f"text example {index}: completion {k}")
            if k != label:
                check(c != completions[label], f"text example {index}: a wrong one is the right")
    again = os.path.join(tmp, "again.bin")
    run("text", text_path, "--out", again, "--examples", "40", "--context", "20",
        "--completion", "6", "--choices", "3", "--seed", "5")
    check(open(again, "rb").read() == open(out, "rb").read(), "text: the same seed, another file")

    # Bad input: exit 2 with the reason, no file.
    bad = os.path.join(tmp, "bad.bin")
    r = run("text", text_path, "--out", bad, "--choices", "1")
    check(r.returncode == 2 and "--choices must be at least 2" in r.stderr, f"choices 1: {r}")
    r = run("text", text_path, "--out", bad, "--context", "5000")
    check(r.returncode == 2 and "fewer than 4 x" in r.stderr, f"long context: {r}")
    r = run("hellaswag", os.path.join(tmp, "none.jsonl"), "--out", bad, "--tokenizer", text_path)
    check(r.returncode == 2, f"hellaswag, no tokenizer.json: {r}")
    same = os.path.join(tmp, "same.txt")
    with open(same, "w") as f:
        f.write("a" * 2000)
    r = run("text", same, "--out", bad)
    check(r.returncode == 2 and "too repetitive" in r.stderr, f"repetitive text: {r}")
    check(not os.path.exists(bad), "a file written for bad input")

    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    except ImportError:
        Tokenizer = None
        print("hellaswag part skipped: the `tokenizers` package is not importable")
    if Tokenizer is not None:
        items = [
            {"ctx": "A man is sitting on a roof. he", "label": 3,
             "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                         "is holding a rubik's cube.", "starts pulling up roofing on a roof."]},
            {"ctx": "The copyright notice", "label": 0,
             "endings": ["shall be included.", "is free of charge.", "obtains a copy.",
                         "is hereby granted."]},
        ]
        jsonl = os.path.join(tmp, "hellaswag_val.jsonl")
        with open(jsonl, "w") as f:
            f.write("".join(json.dumps(i) + "\n" for i in items))
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            [text] + [i["ctx"] + " " + " ".join(i["endings"]) for i in items],
            trainers.BpeTrainer(vocab_size=350, special_tokens=["<|endoftext|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok_path = os.path.join(tmp, "tokenizer.json")
        tok.save(tok_path)
        out = os.path.join(tmp, "hs.bin")
        r = run("hellaswag", jsonl, "--tokenizer", tok_path, "--out", out)
        check(r.returncode == 0, f"hellaswag: exit {r.returncode}: {r.stderr}")
        got = read_back(out)
        check(len(got) == 2, f"hellaswag: {len(got)} examples")
        for (index, label, context, completions), item in zip(got, items):
            want_ctx = tok.encode(item["ctx"], add_special_tokens=False).ids
            check(label == item["label"], f"hellaswag {index}: label {label}")
            check(context == want_ctx, f"hellaswag {index}: context {context} != {want_ctx}")
            for k, ending in enumerate(item["endings"]):
                want = tok.encode(" " + ending, add_special_tokens=False).ids
                check(completions[k] == want, f"hellaswag {index}: completion {k}")
        r = run("hellaswag", jsonl, "--tokenizer", tok_path, "--out", out, "--limit", "1")
        check(len(read_back(out)) == 1, "hellaswag --limit 1")
        broken = os.path.join(tmp, "broken.jsonl")
        with open(broken, "w") as f:
            f.write('{"ctx": "no endings"}\n')
        r = run("hellaswag", broken, "--tokenizer", tok_path, "--out", bad)
        check(r.returncode == 2 and "line 1: not a HellaSwag item" in r.stderr, f"broken: {r}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("make_choices.py: all checks passed")
