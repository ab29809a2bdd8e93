"""The gpt-4o (o200k) pre-tokenizer against an independent reference: llama.cpp's way of running
that regex, reimplemented with Python's `re`.

llama.cpp (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GPT4O) splits with one regex through
std::regex on a "collapsed" copy of the text (src/unicode.cpp, unicode_regex_split): ASCII stays,
non-ASCII whitespace becomes \\x0b, every other non-ASCII code point becomes one stand-in byte for
its general category (letter \\xd2, number \\xd1, punctuation \\xd3, mark \\xd4, symbol \\xd5, other
\\xd0), and \\p{L} / \\p{N} in the regex become [\\xd2A-Za-z] / [\\xd10-9]. The reference below does
exactly that with Python's backtracking `re` (ASCII mode, so \\s is C's isspace), and the unmatched
gaps between matches are pieces of their own, as in llama.cpp.

Environment: MOELITE_PRETOKENIZE_BIN (tests/pretokenize/pretokenize_dump).
"""
import os
import random
import re
import subprocess
import unicodedata

BIN = os.environ.get("MOELITE_PRETOKENIZE_BIN", "build/bin/pretokenize_dump")

L, N = "\xd2A-Za-z", "\xd10-9"
C = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
GPT4O = re.compile(
    "[^\\r\\n%s%s]?((?=[%s])([^a-z]))*((?=[%s])([^A-Z]))+%s" % (L, N, L, L, C)
    + "|[^\\r\\n%s%s]?((?=[%s])([^a-z]))+((?=[%s])([^A-Z]))*%s" % (L, N, L, L, C)
    + "|[%s]{1,3}" % N
    + "| ?[^\\s%s%s]+[\\r\\n/]*" % (L, N)
    + "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    re.ASCII)

# The White_Space property's code points above ASCII.
WHITE_SPACE = {0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000}
STAND_IN = {"L": "\xd2", "N": "\xd1", "P": "\xd3", "M": "\xd4", "S": "\xd5"}


def collapse(text):
    out = []
    for ch in text:
        cp = ord(ch)
        if cp < 128:
            out.append(ch)
        elif cp in WHITE_SPACE:
            out.append("\x0b")
        else:
            out.append(STAND_IN.get(unicodedata.category(ch)[0], "\xd0"))
    return "".join(out)


def reference_pieces(text):
    collapsed, pieces, at = collapse(text), [], 0
    for m in GPT4O.finditer(collapsed):
        if m.start() > at:
            pieces.append(text[at:m.start()])
        pieces.append(text[m.start():m.end()])
        at = m.end()
    if at < len(text):
        pieces.append(text[at:])
    return pieces


CASES = [
    "Hello World", "HelloWorld", "HELLO world", "iPhone XR", "MacBookPro", "ABCdef", "abcDEF",
    "it's", "IT'S", "they'RE here", "we'Ve", "don't'll", "'s", " 's", "x'", "a'b",
    "1234567", "a1b22c333", "٣٤٥٦", "３２１", "ⅫⅩ", "x²³", "3.14159", "$100/month",
    "ÉCOLE", "École", "ÉcOLE", "straße", "ΣΟΦΙΑ σοφία", "ДОМ дом", "中文字符", "日本語とEnglish",
    "e\u0301x", "\u0301abc", "naïve café", "  leading", "trailing  ", "a  b   c", "tab\tsep",
    "line\nbreak", "crlf\r\nend", "\n\n\nx", "x \n \n y", "a\u00a0b", "\u3000全角", "a\u2028b",
    "path/to/file", "a // comment\n", "<|start|>user<|message|>hi<|end|>", "😀 emoji 😀x",
    "∑∫ math", "C++ and C#", "e.g. i.e.", "...", "!!!\n\n", "-- ", " ?!", "hello\r\n\r\n  world",
]

ALPHABET = (list("aAbBzZsStTrReEvVmMlLdD'") * 3 + list("0123456789 \t\n\r/.,!?-_(){}") +
            ["É", "é", "ß", "Σ", "σ", "Д", "д", "中", "٣", "３", "Ⅻ", "²", "\u0301", "\u00a0", "\u3000",
             "😀", "∑", "\u2028", "\x85", "\x1c", "\u200b"])


def random_cases(n, seed=11):
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def engine_pieces(texts):
    data = "".join(t.encode("utf-8").hex() + "\n" for t in texts)
    r = subprocess.run([BIN, "gpt-4o"], input=data, capture_output=True, text=True, check=True)
    lines = r.stdout.split("\n")[:len(texts)]
    return [[bytes.fromhex(h).decode("utf-8") for h in line.split(" ") if h] for line in lines]


def test_reference_knows_the_documented_splits():
    """The reference itself, on splits that follow from the regex by hand."""
    assert reference_pieces("HelloWorld") == ["Hello", "World"]
    assert reference_pieces("it's 12345") == ["it's", " ", "123", "45"]
    assert reference_pieces("ÉCOLE") == ["É", "COLE"]  # llama.cpp tells case apart in ASCII only
    assert reference_pieces("a  b") == ["a", " ", " b"]


def test_pieces_match_the_reference():
    texts = CASES + random_cases(4000)
    got = engine_pieces(texts)
    bad = [(t, g, reference_pieces(t)) for t, g in zip(texts, got) if g != reference_pieces(t)]
    assert not bad, "%d of %d differ, first: %r -> %r, reference %r" % (len(bad), len(texts), *bad[0])
