"""Text keys for the data pipeline: the cleaned problem text that ships, and the aggressive matching keys that
duplicate removal and decontamination compare.

The exported problem is the source's text: `repair_text` applies only the repairs listed in REPAIRS, each one
undoing damage done before the data reached us. Unicode (NFKC) and whitespace normalisation happen only in the
matching keys, never in what the model reads: NFKC would turn the circled labels ①②③ of DAPO-Math-17k into
digits, giving `=0\\quad1` for `=0\\quad①`.
- `dedup_key` (lowercase, single spaces) decides exact duplicates: it must never merge `a+b` with `a-b`.
- `match_key` (lowercase, every run of non-alphanumerics becomes one space, `\\dfrac`/`\\tfrac` -> `\\frac`,
  no `\\left`/`\\right`) is for contamination and near duplicates, where a false alarm only drops a training
  row. With 30-character shingles at >= 60 % overlap it reproduces PROVENANCE.md's contamination counts.
"""

from __future__ import annotations

import re
import unicodedata
import zlib

import numpy as np

# The repairs, in order; docs/data.md lists them and tests/data/test_data_rules.py tests each one.
REPAIRS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    # "\frac" written into JSON unescaped is read back as a form feed followed by "rac" (606 DAPO-Math-17k
    # rows)
    ("form feed for \\f", re.compile(r"\x0c(?=rac|orall)"), r"\\f"),
    # likewise "\beta", "\begin", "\binom", "\boxed" read as a backspace followed by "eta", "egin", ...
    ("backspace for \\b", re.compile(r"\x08(?=eta|egin|inom|oxed)"), r"\\b"),
    ("line endings", re.compile(r"\r\n?"), "\n"),
    # any other control character is invisible debris of PDF extraction (`fi\x0cnd`, `\le\x14`)
    ("control characters", re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"), ""),
    ("outer whitespace", re.compile(r"^\s+|\s+$"), ""),
)
_FRAC_VARIANTS = re.compile(r"\\[dt]frac")
_SIZERS = re.compile(r"\\left|\\right")
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def repair_text(text: str) -> str:
    """The exported form of a problem or answer: the source's text with only the REPAIRS applied."""
    for _, pattern, replacement in REPAIRS:
        text = pattern.sub(replacement, text)
    return text


def dedup_key(text: str) -> str:
    """Key for exact duplicates: case and whitespace differences only."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def match_key(text: str) -> str:
    """Key for near duplicates and contamination: letters and digits only, LaTeX spelling variants folded."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = _SIZERS.sub("", _FRAC_VARIANTS.sub(r"\\frac", text))
    return _NON_ALNUM.sub(" ", text).strip()


def char_ngrams(key: str, n: int) -> set[str]:
    """All n-character substrings of a key (the whole key when it is shorter than n)."""
    if len(key) <= n:
        return {key} if key else set()
    return {key[i : i + n] for i in range(len(key) - n + 1)}


def word_shingles(key: str, n: int) -> np.ndarray:
    """Stable 32-bit hashes of the word n-grams of a key (crc32: the same on every run and machine)."""
    words = key.split()
    if len(words) < n:
        grams = [" ".join(words)] if words else []
    else:
        grams = [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
    return np.unique(np.fromiter((zlib.crc32(g.encode()) for g in grams), dtype=np.uint64, count=len(grams)))


_MERSENNE = np.uint64((1 << 61) - 1)


def minhash_signature(shingles: np.ndarray, num_perm: int, seed: int = 0) -> np.ndarray:
    """MinHash signature (num_perm uint64 values): min over shingles of (a*x + b) mod p for random a, b.

    Hashes are 32-bit and a, b < 2^29, so a*x + b < 2^61 never overflows uint64.
    """
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 1 << 29, size=num_perm, dtype=np.uint64)
    b = rng.integers(0, 1 << 29, size=num_perm, dtype=np.uint64)
    if shingles.size == 0:
        return np.full(num_perm, np.iinfo(np.uint64).max, dtype=np.uint64)
    return ((np.outer(shingles, a) + b) % _MERSENNE).min(axis=0)
