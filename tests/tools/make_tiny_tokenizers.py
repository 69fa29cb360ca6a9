#!/usr/bin/env python3
"""Trains tiny (512-token) tokenizers on real English text for the C++ tokenizer tests.

Usage: make_tiny_tokenizers.py OUT

Writes, deterministically:
  OUT/tokenizers/bpe/{tokenizer.json,tokenizer_config.json,gguf_tokenizer.json}
      HF byte-level BPE with the SmolLM2 pre-tokenizer (individual digits, then ByteLevel).
  OUT/tokenizers/qwen2/{tokenizer.json,tokenizer_config.json,gguf_tokenizer.json}
      HF byte-level BPE with the Qwen2 Split regex, then ByteLevel(use_regex=False).
  OUT/tokenizers/spm/{spm.model,gguf_tokenizer.json}
      SentencePiece BPE with byte fallback (the GGUF "llama" tokenizer family).
  OUT/tokenizers/llama3/{tokenizer.json,tokenizer_config.json,gguf_tokenizer.json}
      HF byte-level BPE with Llama 3's Split regex and ignore_merges, as Llama 3.x ships.
  OUT/tokenizers/spm_hf/{tokenizer.json,tokenizer_config.json}
      The SentencePiece model converted as Hugging Face converts TinyLlama's and Phi-3's.
  OUT/tokenizers/{qwen2_nfc,qwen2_nfkc}/{tokenizer.json,tokenizer_config.json}
      The qwen2 tokenizer with an NFC normalizer (as real Qwen2 and Qwen2.5 ship) or NFKC.
The gguf_tokenizer.json files hold exactly the tokenizer.ggml.* metadata values that the tiny
model GGUFs carry. Training uses the first 80% of the Jargon File; tokenizer_reference.py takes
its evaluation paragraphs from the rest.
"""

import gzip
import io
import json
import os
import subprocess
import sys

VOCAB_SIZE = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TRAIN_FRACTION = 0.8

# The regex of Qwen2's tokenizer.json Split pre-tokenizer (also llama.cpp's "qwen2" pre type).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Llama 3's tokenizer.json Split regex (llama.cpp's "llama-bpe" pre type): digits in runs of up
# to three.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

JARGON_CANDIDATES = [
    "/usr/share/jargon-text/jargon.txt",
    "/usr/share/doc/jargon-text/jargon.txt",
    "/usr/share/doc/jargon-text/jargon.txt.gz",
]


def find_jargon():
    """Path of the Jargon File shipped by the Debian package jargon-text."""
    for path in JARGON_CANDIDATES:
        if os.path.exists(path):
            return path
    try:
        listing = subprocess.run(["dpkg", "-L", "jargon-text"], capture_output=True, text=True,
                                 check=False).stdout.split()
    except OSError:
        listing = []
    for path in listing:
        if os.path.basename(path).startswith("jargon.txt") and os.path.isfile(path):
            return path
    sys.exit("make_tiny_tokenizers.py: jargon.txt not found; install the Debian package "
             "jargon-text (apt-get install jargon-text)")


def read_jargon_lines():
    """All lines of the Jargon File, without line terminators."""
    path = find_jargon()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def train_split(lines):
    """(training lines, held-out lines): a fixed split so evaluation text is never trained on."""
    cut = int(len(lines) * TRAIN_FRACTION)
    return lines[:cut], lines[cut:]


def paragraphs(lines):
    """Blank-line separated paragraphs with their newlines and indentation kept, so the BPE
    tokenizers learn whitespace runs too."""
    out, cur = [], []
    for line in lines:
        if line.strip():
            cur.append(line)
        elif cur:
            out.append("\n".join(cur) + "\n")
            cur = []
    if cur:
        out.append("\n".join(cur) + "\n")
    return out


def train_hf(paras, pre_tokenizer, post_processor):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    if post_processor is not None:
        tok.post_processor = post_processor
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(paras, trainer=trainer, length=len(paras))
    if tok.get_vocab_size() != VOCAB_SIZE:
        sys.exit(f"trained vocab has {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def gguf_spec_from_hf(tok, pre):
    """tokenizer.ggml.* values for a byte-level HF tokenizer, as llama.cpp's converter writes them."""
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    assert all(t is not None for t in tokens)
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    return {
        "model": "gpt2", "pre": pre, "tokens": tokens, "token_type": types, "merges": merges,
        "bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0, "padding_token_id": 2,
        "add_bos_token": False,
    }


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")


def write_hf(out_dir, tok, pre):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    # What transformers keeps beside tokenizer.json; the C++ reader takes bos/eos/pad from it.
    write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 2048,
    })
    write_json(os.path.join(out_dir, "gguf_tokenizer.json"), gguf_spec_from_hf(tok, pre))


def make_bpe(out, paras):
    from tokenizers import pre_tokenizers
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    write_hf(os.path.join(out, "tokenizers", "bpe"), train_hf(paras, pre, None), "smollm")


def make_qwen2(out, paras):
    from tokenizers import Regex, pre_tokenizers, processors
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    post = processors.ByteLevel(trim_offsets=False)
    write_hf(os.path.join(out, "tokenizers", "qwen2"), train_hf(paras, pre, post), "qwen2")


def make_llama3(out, paras):
    from tokenizers import Regex, Tokenizer, pre_tokenizers, processors
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok = train_hf(paras, pre, processors.ByteLevel(trim_offsets=False))
    # Llama 3 emits a pre-token that is itself in the vocabulary whole (model.ignore_merges).
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    write_hf(os.path.join(out, "tokenizers", "llama3"), tok, "llama-bpe")


def make_normalized(out):
    """The qwen2 tokenizer behind a Unicode normalizer; tokenizer.json only (GGUF has none)."""
    from tokenizers import Tokenizer, normalizers
    src = os.path.join(out, "tokenizers", "qwen2")
    for name, normalizer in (("qwen2_nfc", normalizers.NFC()), ("qwen2_nfkc", normalizers.NFKC())):
        tok = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
        tok.normalizer = normalizer
        dst = os.path.join(out, "tokenizers", name)
        os.makedirs(dst, exist_ok=True)
        tok.save(os.path.join(dst, "tokenizer.json"))
        with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
            write_json(os.path.join(dst, "tokenizer_config.json"), json.load(f))


def write_spm_as_hf(sp, out_dir):
    """The SentencePiece model as the tokenizer.json Hugging Face's LlamaConverter makes of
    TinyLlama's and Phi-3's: a byte-fallback BPE whose merges are every split of a piece into two
    pieces, ordered by the piece's score, behind Prepend("▁") and Replace(" ", "▁")."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for i, piece in enumerate(pieces):
        local = [(piece[:k], piece[k:], sp.get_score(i)) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges = [(l, r) for l, r, _ in sorted(merges, key=lambda m: m[2], reverse=True)]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in ("<unk>", "<s>", "</s>")])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
        "model_max_length": 2048,
    })


def make_spm(out, lines):
    import sentencepiece as spm
    sentences = [l.strip() for l in lines if l.strip()]
    model = io.BytesIO()
    # identity normalization and kept whitespace: llama.cpp's SPM tokenizer normalizes nothing,
    # so the reference must not either.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, model_type="bpe",
        vocab_size=VOCAB_SIZE, byte_fallback=True, character_coverage=0.9995,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
        input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
    spm_dir = os.path.join(out, "tokenizers", "spm")
    os.makedirs(spm_dir, exist_ok=True)
    with open(os.path.join(spm_dir, "spm.model"), "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    if n != VOCAB_SIZE:
        sys.exit(f"sentencepiece vocab has {n} pieces, expected {VOCAB_SIZE}")
    tokens, scores, types = [], [], []
    for i in range(n):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_unused(i):
            types.append(5)
        elif sp.is_byte(i):
            types.append(6)
        else:
            types.append(1)
    write_spm_as_hf(sp, os.path.join(out, "tokenizers", "spm_hf"))
    write_json(os.path.join(spm_dir, "gguf_tokenizer.json"), {
        "model": "llama", "tokens": tokens, "scores": scores, "token_type": types,
        "bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0, "add_bos_token": True,
        "add_space_prefix": True,
    })


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    train_lines, _ = train_split(read_jargon_lines())
    paras = paragraphs(train_lines)
    make_bpe(out, paras)
    make_qwen2(out, paras)
    make_llama3(out, paras)
    make_normalized(out)
    make_spm(out, train_lines)
    print(f"make_tiny_tokenizers: wrote {out}/tokenizers/{{bpe,qwen2,llama3,qwen2_nfc,qwen2_nfkc,spm}}")


if __name__ == "__main__":
    main()
