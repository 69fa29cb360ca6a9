#!/usr/bin/env python3
"""Golden token ids from independent tokenizer implementations, for the C++ tokenizer tests.

Usage: tokenizer_reference.py OUT MODEL

Reads the tiny tokenizers of make_tiny_tokenizers.py under OUT/tokenizers and the real SmolLM2
GGUF at MODEL, and writes OUT/tokenizer_golden.json:
  {"texts": [{"name", "text"}...],
   "tokenizers": [{"name", "reference", sources..., "encodings": [{"text", "parse_special",
                   "ids"}...]}...]}
Ids never include BOS/EOS (the tests add those themselves). References: Hugging Face `tokenizers`
for the byte-level BPE files (and for SmolLM2, rebuilt from the GGUF's vocab and merges),
`sentencepiece` for the SPM model. SmolLM2 ids are also cross-checked against llama.cpp
(llama-cpp-python) when it is installed, and so are the tiny tokenizers' (through a temporary
vocab-only GGUF). A missing MODEL skips the SmolLM2 entry.
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_tokenizers as tiny  # noqa: E402
from quiet import quiet_native_stderr  # noqa: E402

# Texts that exercise the pre-tokenizers' corners. Names are stable: the C++ tests refer to some.
EDGE_CASES = [
    ("empty", ""),
    ("single_space", " "),
    ("digits", "In 1987, 42 hackers wrote 3.14159 and 1,000,000 lines; call 555-0123 or 0x7F."),
    ("long_number", "12345678901234567890"),
    ("punctuation_runs", "Wait... what?!?! (yes) [no] {maybe} --- *** ### $$$ @@ ~~ ``quoted''"),
    ("spaces", "a  b   c    d     e      f"),
    ("leading_trailing_spaces", "   indented text with trailing spaces   "),
    ("newlines", "line one\nline two\n\nline four\n\n\n  indented\r\nwindows line\r\n"),
    ("tabs", "col1\tcol2\t\tcol3\n\tindented\t \ttrailing\t"),
    ("contractions", "I'm sure you'll see it's what they'd've done; WE'LL see, DON'T we? I'M"),
    ("accents", "Café naïve façade résumé Ångström über coöperate señor jalapeño"),
    ("cjk", "日本語のテキストと中文文本，한국어 텍스트。"),
    ("emoji", "Hello 👋 world 🌍! Family: 👨‍👩‍👧 flags 🇫🇷 ✨✨"),
    ("mixed_scripts", "Ελληνικά, Русский текст, עברית, العربية and English."),
    ("symbols", "x^2 + y_1 = z; a->b && c||d != e <= f >= g == h // comment /* c */"),
    ("code", "def f(x):\n    return x * 2  # double\n\nfor i in range(10):\n    print(f(i))\n"),
    ("url_email", "See https://www.catb.org/jargon/html/index.html or mail esr@snark.thyrsus.com."),
    ("unicode_spaces", "a\u00a0b\u3000c\u2009d\u200be\u0085f\u2028g\x0b\x0ch\ri \u00a0 \u3000j"),
    ("combining_marks", "e\u0301 n\u0303 Z\u0351\u0355 \u0915\u094d\u0937 a\u20dd"),
    ("other_numerals", "\u0663\u0664\u0665 \u0967\u0968 \u2460\u2461 \u00bd \u216b 2\u00b2 x\u2081"),
    ("special_chat", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>"),
    ("special_adjacent", "<|endoftext|><|endoftext|>text<|im_end|> trailing"),
    ("special_partial", "<|im_start <|im_end| <|imstart|> |> <| almost<|im_start|"),
    ("spm_special", "<s>Hello world</s> again <unk> here"),
    ("nfc_decomposed", "Cafe\u0301 a\u0308 o\u0302 A\u030a n\u0303 \u1112\u1161\u11ab\u1100\u1173\u11af "
                       "\u0915\u093c \u212b \u2126 e\u0301\u0301 \u0073\u0323\u0307"),
    ("compatibility", "\ufb01nance \ufb02ow \u2460\u2461 \uff21\uff22\uff23 \u00bd \u2075 \u3392 "
                      "\u337f \uff76\uff9e \u01c4 \u2163 \u00b5"),
]

# Languages whose country names (Debian's iso-codes translations of ISO 3166-1) are real
# multilingual test text: Latin with diacritics, Cyrillic, Greek, Hebrew, Arabic, Devanagari,
# Thai, CJK and Hangul. Each is also given in NFD, the decomposed form NFC has to undo.
ISO_CODES_LANGUAGES = ["vi", "ko", "ja", "zh_CN", "ar", "hi", "ru", "el", "he", "th", "de", "pl",
                       "tr", "cs"]
ISO_CODES_NFD = {"vi", "ko", "el", "de", "hi"}
ISO_3166_JSON = "/usr/share/iso-codes/json/iso_3166-1.json"

# Number of held-out Jargon File paragraphs used as real-text cases, and one long chunk.
NUM_PARAGRAPHS = 8
LONG_TEXT_CHARS = 30000


def real_texts():
    """Held-out Jargon File text (never seen by make_tiny_tokenizers.py's training)."""
    _, held_out = tiny.train_split(tiny.read_jargon_lines())
    paras = [p for p in tiny.paragraphs(held_out) if len(p) > 300]
    step = max(1, len(paras) // NUM_PARAGRAPHS)
    picked = [(f"jargon_paragraph_{i}", paras[i * step]) for i in range(NUM_PARAGRAPHS)]
    long_text = "\n".join(held_out)
    start = len(long_text) // 3
    picked.append(("jargon_long", long_text[start:start + LONG_TEXT_CHARS]))
    return picked


def multilingual_texts():
    """Country names in each of ISO_CODES_LANGUAGES (Debian package iso-codes)."""
    import gettext
    import unicodedata
    if not os.path.exists(ISO_3166_JSON):
        sys.exit(f"tokenizer_reference.py: {ISO_3166_JSON} not found; install the Debian package "
                 "iso-codes (apt-get install iso-codes)")
    with open(ISO_3166_JSON, encoding="utf-8") as f:
        names = [c["name"] for c in json.load(f)["3166-1"]]
    out = []
    for lang in ISO_CODES_LANGUAGES:
        t = gettext.translation("iso_3166-1", localedir="/usr/share/locale", languages=[lang])
        text = ", ".join(t.gettext(n) for n in names)
        out.append((f"iso_3166_{lang}", text))
        if lang in ISO_CODES_NFD:
            out.append((f"iso_3166_{lang}_nfd", unicodedata.normalize("NFD", text)))
    return out


def split_specials(text, specials):
    """Leftmost-longest literal split: [(piece, special?)], the rule of HF's added vocabulary."""
    out, start, i = [], 0, 0
    by_len = sorted(specials, key=len, reverse=True)
    while i < len(text):
        hit = next((s for s in by_len if text.startswith(s, i)), None)
        if hit is None:
            i += 1
            continue
        if start < i:
            out.append((text[start:i], False))
        out.append((hit, True))
        i += len(hit)
        start = i
    if start < len(text):
        out.append((text[start:], False))
    return out


def hf_encodings(tok, texts):
    encs = []
    for idx, (_, text) in enumerate(texts):
        for parse_special in (True, False):
            # encode_special_tokens=True makes HF treat special added tokens as plain text.
            tok.encode_special_tokens = not parse_special
            ids = tok.encode(text, add_special_tokens=False).ids
            encs.append({"text": idx, "parse_special": parse_special, "ids": ids})
    tok.encode_special_tokens = False
    return encs


def hf_entry(out, name, texts):
    from tokenizers import Tokenizer
    import tokenizers
    rel = os.path.join("tokenizers", name)
    tok = Tokenizer.from_file(os.path.join(out, rel, "tokenizer.json"))
    entry = {
        "name": name, "reference": f"tokenizers {tokenizers.__version__}",
        "tokenizer_json": os.path.join(rel, "tokenizer.json"),
        "encodings": hf_encodings(tok, texts),
    }
    if os.path.exists(os.path.join(out, rel, "gguf_tokenizer.json")):
        entry["gguf_spec"] = os.path.join(rel, "gguf_tokenizer.json")
    return entry


def spm_entry(out, texts):
    import sentencepiece as spm
    rel = os.path.join("tokenizers", "spm")
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, rel, "spm.model"))
    with open(os.path.join(out, rel, "gguf_tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    # Control and unknown pieces are matched literally when parse_special (llama.cpp's rule);
    # sentencepiece itself never matches them, so each text segment is encoded on its own, which
    # also gives every segment its dummy-prefix space as llama.cpp and HF's slow tokenizer do.
    specials = [t for t, ty in zip(spec["tokens"], spec["token_type"]) if ty in (2, 3)]
    encs = []
    for idx, (_, text) in enumerate(texts):
        for parse_special in (True, False):
            ids = []
            segments = split_specials(text, specials) if parse_special else [(text, False)]
            for piece, special in segments:
                if special:
                    ids.append(sp.piece_to_id(piece))
                elif piece:
                    ids.extend(sp.encode(piece, out_type=int))
            encs.append({"text": idx, "parse_special": parse_special, "ids": ids})
    return {
        "name": "spm", "reference": f"sentencepiece {spm.__version__}",
        "gguf_spec": os.path.join(rel, "gguf_tokenizer.json"), "encodings": encs,
    }


def read_gguf_vocab(model_path):
    from gguf import GGUFReader
    reader = GGUFReader(model_path)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def ints(key):
        field = reader.fields[key]
        return [int(field.parts[i][0]) for i in field.data]

    def scalar_string(key):
        field = reader.fields[key]
        return bytes(field.parts[field.data[0]]).decode("utf-8")

    return {
        "model": scalar_string("tokenizer.ggml.model"), "pre": scalar_string("tokenizer.ggml.pre"),
        "tokens": strings("tokenizer.ggml.tokens"), "token_type": ints("tokenizer.ggml.token_type"),
        "merges": strings("tokenizer.ggml.merges"),
    }


def smollm2_entry(model_path, texts):
    """SmolLM2's GGUF vocab and merges rebuilt as an HF tokenizer with the smollm pre-tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    import tokenizers
    meta = read_gguf_vocab(model_path)
    if meta["model"] != "gpt2" or meta["pre"] != "smollm":
        sys.exit(f"{model_path}: expected a gpt2/smollm tokenizer, got {meta['model']}/{meta['pre']}")
    vocab = {t: i for i, t in enumerate(meta["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    control = [t for t, ty in zip(meta["tokens"], meta["token_type"]) if ty == 3]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    encs = hf_encodings(tok, texts)
    entry = {
        "name": "smollm2", "reference": f"tokenizers {tokenizers.__version__} (GGUF vocab)",
        "gguf": os.path.abspath(model_path), "encodings": encs,
    }
    entry["llama_cpp_check"] = llama_cpp_check(model_path, texts, encs)
    return entry


def llama_cpp_check(model_path, texts, encs):
    """Compares the golden ids with llama.cpp's tokenizer; returns a summary for the record."""
    try:
        import llama_cpp
    except ImportError:
        return {"status": "llama-cpp-python not installed"}
    with quiet_native_stderr():
        llm = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    mismatches = []
    for enc in encs:
        name, text = texts[enc["text"]]
        got = llm.tokenize(text.encode("utf-8"), add_bos=False, special=enc["parse_special"])
        if list(got) != enc["ids"]:
            mismatches.append(f"{name} (parse_special={enc['parse_special']})")
    for m in mismatches:
        print(f"tokenizer_reference: llama.cpp differs on {m} ({model_path})", file=sys.stderr)
    return {"status": f"llama-cpp-python {llama_cpp.__version__}", "compared": len(encs),
            "mismatches": mismatches}


def llama_cpp_check_spec(out, entry, texts):
    """llama_cpp_check for a tiny tokenizer: its gguf_tokenizer.json values go into a temporary
    vocab-only GGUF (a llama header with made-up sizes and no tensors)."""
    try:
        import gguf
        import llama_cpp  # noqa: F401
    except ImportError:
        return {"status": "llama-cpp-python not installed"}
    with open(os.path.join(out, entry["gguf_spec"]), encoding="utf-8") as f:
        spec = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vocab.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_context_length(64)
        w.add_embedding_length(8)
        w.add_block_count(1)
        w.add_feed_forward_length(8)
        w.add_head_count(1)
        w.add_head_count_kv(1)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(len(spec["tokens"]))
        w.add_tokenizer_model(spec["model"])
        if "pre" in spec:
            w.add_tokenizer_pre(spec["pre"])
        w.add_token_list(spec["tokens"])
        w.add_token_types(spec["token_type"])
        if "scores" in spec:
            w.add_token_scores(spec["scores"])
        if "merges" in spec:
            w.add_token_merges(spec["merges"])
        w.add_bos_token_id(spec["bos_token_id"])
        w.add_eos_token_id(spec["eos_token_id"])
        w.add_unk_token_id(spec["unknown_token_id"])
        w.add_add_bos_token(spec["add_bos_token"])
        if "add_space_prefix" in spec:
            w.add_add_space_prefix(spec["add_space_prefix"])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return llama_cpp_check(path, texts, entry["encodings"])


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out, model_path = sys.argv[1], sys.argv[2]
    texts = real_texts() + EDGE_CASES + multilingual_texts()
    entries = [hf_entry(out, "bpe", texts), hf_entry(out, "qwen2", texts),
               hf_entry(out, "llama3", texts), spm_entry(out, texts)]
    for entry in entries:
        entry["llama_cpp_check"] = llama_cpp_check_spec(out, entry, texts)
    entries += [hf_entry(out, "qwen2_nfc", texts), hf_entry(out, "qwen2_nfkc", texts),
                hf_entry(out, "spm_hf", texts)]
    if os.path.exists(model_path):
        entries.append(smollm2_entry(model_path, texts))
    else:
        print(f"tokenizer_reference: {model_path} not found; no SmolLM2 goldens", file=sys.stderr)
    golden = {"texts": [{"name": n, "text": t} for n, t in texts], "tokenizers": entries}
    tiny.write_json(os.path.join(out, "tokenizer_golden.json"), golden)
    print(f"tokenizer_reference: wrote {out}/tokenizer_golden.json "
          f"({len(texts)} texts, {len(entries)} tokenizers)")


if __name__ == "__main__":
    main()
