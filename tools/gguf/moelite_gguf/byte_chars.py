"""GPT-2's byte-level BPE alphabet: each byte maps to a printable code point (bytes that print as
themselves keep their code; the others move to 256 + n)."""


def byte_chars():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
