#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer-conformance.json: ~200 varied strings and
the token ids (and decoded text) Hugging Face transformers' tokenizer gives
for them, with the Qwen3 tokenizer files and the sfi-small-qwen3 model's own
tokenizer files. tests/test_tokenizer.c checks that sfi gives the same ids.

Run once where transformers is installed (no network needed), from the
source root:
    python3 tests/make_tokenizer_fixtures.py
With --fuzz N [--seed S] it writes nothing and instead compares the built
./sfi-ref encode with transformers on N random strings (any code point,
combining marks, odd whitespace, added tokens) and prints the mismatches.
It reads tests/fixtures/qwen3-tokenizer and
tests/fixtures/sfi-small-qwen3-tokenizer (copies of the files in
../shared/data/qwen3-tokenizer and ../shared/models/sfi-small-qwen3)."""
import json
import os
import random
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DIRS = ["qwen3-tokenizer", "sfi-small-qwen3-tokenizer"]

STRINGS = [
    # English, punctuation, contractions (the pattern's case-insensitive
    # 's 't 're 've 'm 'll 'd alternatives).
    "Hello world! This is a test.",
    "The quick brown fox jumps over the lazy dog.",
    "It's a dog's life, isn't it? We're here; they've gone.",
    "I'M SURE YOU'LL SEE WHAT HE'D DONE AND SHE'S DOING.",
    "don't can't won't shouldn't y'all o'clock rock'n'roll",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D 'x",
    "\"Quoted,\" she said. 'Single quotes' too.",
    "Mr. Smith went to Washington D.C. in 1999 A.D.",
    "Wait... what?! No way!!! Really???",
    "e.g. i.e. etc. vs. cf.",
    "a-b c_d e/f g\\h i|j k~l m^n",
    "(parenthesized) [bracketed] {braced} <angled>",
    "email: someone@example.com, url: https://example.org/path?q=1&r=2#frag",
    "#hashtag @mention $100 50% 3*4=12 2^10 a&b",
    "He said: \u201cHello\u201d \u2014 and left\u2026",
    "It\u2019s the \u2018smart\u2019 apostrophe.",
    "Title Case Words Are Here",
    "ALLCAPS lowercase MiXeDcAsE camelCase PascalCase snake_case kebab-case",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    # Numbers: the pattern splits digits one by one.
    "12345",
    "3.14159265358979",
    "1,000,000 and 1.000.000 and 1 000 000",
    "2026-11-23T11:28:53Z",
    "+1 (555) 123-4567",
    "0x1F 0b1010 0o777 1e-8 6.02e23",
    "v1.2.3-rc.4+build.5",
    "Room 101, floor 3, 42nd street",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \uff11\uff12\uff13 \u2460\u2461 \u00bd \u00b2",
    # Whitespace runs, tabs, newlines, carriage returns.
    "a  b   c    d",
    "   leading spaces",
    "trailing spaces   ",
    "   ",
    " ",
    "",
    "\t",
    "tab\tseparated\tvalues",
    "\t\tindented with tabs",
    "line one\nline two\nline three",
    "windows\r\nline\r\nendings\r\n",
    "old mac\rline",
    "\n",
    "\n\n",
    "\n\n\n\n",
    "para one.\n\npara two.\n\n\npara three.",
    "  \n  \n  x",
    "x \n y",
    "end with newline\n",
    " \t \n \r\n \t",
    "word\n\n\n    indented after blank lines",
    ".\n",
    "?\n\n",
    "!\r\n",
    "a\u00a0b\u00a0\u00a0c",
    "ideographic\u3000space\u3000\u3000x",
    "em\u2003space en\u2002space thin\u2009space",
    "zero\u200bwidth\u200bspace",
    "bom\ufeffinside",
    "next\u0085line",
    "line\u2028separator\u2029paragraph",
    "vertical\x0btab\x0cformfeed",
    # Code.
    "def f(x):\n    return x * 2\n",
    "for i in range(10):\n\tprint(i, end=' ')\n",
    "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
    "if (x != NULL && x->next) { x = x->next; } else { x++; }",
    "const f = async (a, b) => { await g(a ?? b); };",
    "{\"key\": [1, 2, {\"nested\": null}], \"ok\": true}",
    "<div class=\"main\"><p>Hello &amp; welcome</p></div>",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "$ ls -la | grep '^d' > out.txt 2>&1 && echo done",
    "    # comment with    spaces\n    x = 1  # trailing\n",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "a==b!=c<=d>=e&&f||g<<h>>i+=j-=k",
    "/* block */ // line\n--[[ lua ]]",
    "\\begin{equation} E = mc^2 \\end{equation}",
    "x_1, x_2, ..., x_n \u2208 \u211d^n, \u2211_{i=1}^{n} x_i \u2264 \u221e",
    "____ ---- ==== **** #### ~~~~",
    "    \n        \n",
    # CJK.
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002",
    "\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u306d\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",
    "\u6f22\u5b57\u3068English\u304cmixed\u3055\u308c\u305f\u6587\u7ae0123\u3002",
    "\u4e2d\u6587\u6807\u70b9\uff1a\u300c\u5f15\u53f7\u300d\u3001\u300e\u4e66\u540d\u300f\uff08\u62ec\u53f7\uff09\u2026\u2026",
    "\uff21\uff22\uff23 \uff41\uff42\uff43 fullwidth",
    "\u3000\u3000\u6bb5\u843d\u7f29\u8fdb",
    # Emoji.
    "\U0001F389 party \U0001F600\U0001F601\U0001F602",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family",
    "\U0001F44D\U0001F3FD thumbs up with skin tone",
    "\U0001F1EF\U0001F1F5 \U0001F1FA\U0001F1F8 flags",
    "\u2764\ufe0f heart \u2728 sparkles \u2615 coffee",
    "emoji\U0001F680in\U0001F30Dthe\U0001F31Fmiddle",
    "\U0001F9D1\u200d\U0001F4BB coder",
    # Accents and NFC: precomposed and decomposed forms.
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade \u00fcber",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "A\u030a \u212b \u00c5 (three ways to write A with ring)",
    "\u1ec7 e\u0323\u0302 e\u0302\u0323 (Vietnamese, marks in both orders)",
    "Vi\u1ec7t Nam, ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",
    "o\u0308\u0304 \u022b u\u0308\u0301 \u01d8",
    "\u1100\u1161\u11a8 \u1100\u1161 \uac01 (Hangul jamo and syllables)",
    "\u0915\u094d\u0937 \u0928\u092e\u0938\u094d\u0924\u0947 (Devanagari)",
    "\u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645 (Arabic)",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd (Hebrew)",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a (Thai)",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5 \u03ac\u0301",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0439 \u0438\u0306",
    "Stra\u00dfe \u00c6sir \u0153uvre \u0141\u00f3d\u017a \u00d8resund",
    "\ufb01 \ufb02 ligatures stay (NFC is not NFKC)",
    "\u2126 ohm \u03a9 omega \u212a kelvin",
    "\u0344 \u0343 \u0340 \u0341 (singletons)",
    "x\u0301\u0316\u0300 combining on x",
    # Where newer Unicode data would differ from tokenizers' (older) data:
    # U+1DF8 and U+089B have no combining class there, U+11938 does not
    # decompose, and U+180E is not whitespace (PCRE2's \\s would say so).
    "a\u1df8\u302a a\u1df8\u0316 \u0638\u089b\u302a",
    "\U00011935\U00011930 \U00011938",
    "x\u180e?v \u3000\u180e's \u180e'll",
    # Letters and digits of Unicode 15/16 (Kawi, Nag Mundari, Egyptian
    # hieroglyphs extended-A, Garay digits): letters to tokenizers, not to
    # PCRE2 10.42.
    "<\U00011F04\U00011F05 \U0001E4D0\U0001E4D1's -\U00013460x \U00010D40\U00010D41",
    "\u0301 leading combining mark",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0334\u0335\u031c\u0330\u0354L\u0348\u0330\u0318\u0347\u0333G\u0361O zalgo",
    # Added and special tokens.
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|>",
    "<|im_start|>",
    "<|im_start",
    "<|im_start|",
    "|im_start|>",
    "<<|im_end|>>",
    "< |im_end| >",
    "<think>\nLet me think.\n</think>\n\nAnswer.",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|fim_prefix|>def f(<|fim_suffix|>):<|fim_middle|>",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "caf\u00e9<|endoftext|>cafe\u0301",
    " <|im_end|> ",
    "<|IM_START|> is not special",
    # Control characters and odd bytes (valid UTF-8 all).
    "nul\x00byte",
    "\x1b[31mred\x1b[0m",
    "del\x7fchar",
    "\x01\x02\x03",
    "\ufffd replacement char",
    "\U0010FFFF max code point",
    "\ue000 private use",
    "\U0001D400\U0001D401 math bold",
    # Longer runs.
    "a" * 300,
    " " * 100 + "x",
    "\n" * 50,
    "ab" * 200,
    "9" * 64,
    "!" * 40,
    "The " * 60,
    "\u4e2d" * 80,
    "\U0001F600" * 30,
]

# Deterministic mixtures of the pieces above, to reach ~200 strings and hit
# boundaries between scripts, numbers, spaces and punctuation.
PIECES = ["word", " Word", "'s", "'LL", "123", " 4.5", "  ", "\n", "\n\n", "\t", " \u00e9",
          "e\u0301", "\u4e2d\u6587", "\U0001F389", "...", "?!", " -", "<|im_end|>", "\r\n",
          "\u00a0", "x", "(y)", "\u3002", " \u3000", ";", "::", "$", "\u0301"]


def mixtures(n, seed=20261123):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(3, 12)
        out.append("".join(rng.choice(PIECES) for _ in range(k)))
    return out


def fuzz(n, seed):
    """Random strings; all are encoded by one sfi-ref process, joined by
    <|endoftext|>: an added token splits the text into segments that are
    normalized and pre-tokenized independently, so the joined ids are the
    per-string ids separated by its id."""
    import subprocess
    rng = random.Random(seed)
    pool = list(" \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000"
                "\u200b\u200c\u200d\u2060\ufeff\u180e") + \
        list("abcXYZ'sSdDlLtTmMvVreE.,;:!?-_()[]{}<>|\\/\"#$%&*+=@^`~0123456789") + \
        ["<|im_start|>", "<|im_end|>", "<think>", "'s", "'ll", "'LL", "'Re"]
    marks = ["\u0301", "\u0300", "\u0323", "\u0302", "\u0308", "\u0327", "\u0316", "\u0345",
             "\u05b0", "\u0f71", "\u302a", "\u1df8", "\u1161", "\u11a8", "\u1100"]

    def any_cp():
        while True:
            c = rng.randrange(0x20, 0x110000)
            if not 0xD800 <= c <= 0xDFFF:
                return chr(c)

    cases = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.5:
                parts.append(rng.choice(pool))
            elif r < 0.7:
                parts.append(rng.choice(marks))
            elif r < 0.85:
                parts.append(any_cp())
            else:
                parts.append(chr(rng.choice([0x41, 0x61, 0x4E00, 0xAC00, 0x0915, 0x3042,
                                             0x1F600, 0x0627, 0x11F04, 0x1E4D0])
                                 + rng.randrange(0, 40)))
        cases.append("".join(parts))
    bad = 0
    for d in DIRS:
        path = os.path.join(HERE, "fixtures", d)
        tok = AutoTokenizer.from_pretrained(path)
        sep = tok.convert_tokens_to_ids("<|endoftext|>")
        text = "<|endoftext|>".join(cases).encode("utf-8")
        got = subprocess.run(["./sfi-ref", "encode", "--tokenizer", path], input=text,
                             capture_output=True, check=True).stdout.split()
        ours, cur = [], []
        for x in map(int, got):
            if x == sep:
                ours.append(cur)
                cur = []
            else:
                cur.append(x)
        ours.append(cur)
        assert len(ours) == len(cases)
        miss = 0
        for c, o in zip(cases, ours):
            want = tok.encode(c, add_special_tokens=False)
            if want != o:
                miss += 1
                if miss <= 5:
                    print("MISMATCH %s %s\n want %s\n ours %s" % (d, ascii(c), want, o))
        print("fuzz %s: %d/%d random strings give transformers' ids" % (d, n - miss, n))
        bad += miss
    return 1 if bad else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--fuzz":
        seed = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--seed" else 1
        sys.exit(fuzz(int(sys.argv[2]), seed))
    strings = STRINGS + mixtures(200 - len(STRINGS))
    result = {
        "generator": "tests/make_tokenizer_fixtures.py",
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "tokenizers": {},
    }
    for d in DIRS:
        tok = AutoTokenizer.from_pretrained(os.path.join(HERE, "fixtures", d))
        cases = []
        for s in strings:
            ids = tok.encode(s, add_special_tokens=False)
            cases.append({"text": s, "ids": ids, "decoded": tok.decode(ids)})
        result["tokenizers"][d] = {"class": type(tok).__name__, "cases": cases}
    path = os.path.join(HERE, "fixtures", "tokenizer-conformance.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        # One case per line keeps diffs readable.
        f.write("{\n")
        for key in ("generator", "transformers_version", "tokenizers_version"):
            f.write(" %s: %s,\n" % (json.dumps(key), json.dumps(result[key])))
        f.write(' "tokenizers": {\n')
        for i, d in enumerate(DIRS):
            t = result["tokenizers"][d]
            f.write("  %s: {\"class\": %s, \"cases\": [\n" % (json.dumps(d), json.dumps(t["class"])))
            f.write(",\n".join("   " + json.dumps(c, ensure_ascii=False) for c in t["cases"]))
            f.write("\n  ]}%s\n" % ("," if i + 1 < len(DIRS) else ""))
        f.write(" }\n}\n")
    os.replace(tmp, path)
    json.load(open(path, encoding="utf-8"))  # the file must parse
    print("%s: %d strings x %d tokenizers" % (path, len(strings), len(DIRS)), file=sys.stderr)


if __name__ == "__main__":
    main()
