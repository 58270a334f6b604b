"""One number grammar for every verifier: what counts as a number in a completion, read the same everywhere.

A number is ``[sign] digits [.digits] [e|E [sign] digits]`` where

- digits are ASCII ``0-9`` only (a completion with any other character Python calls a digit, ``'²'``,
  ``'①'``, ``'４'``, ``'٤'``, reads as no number: `foreign_digits`);
- the sign may be ``-`` or ``+``; the minus signs U+2212, U+FE63 and U+FF0D read as ``-``;
- the integer part may group thousands with commas (``1,000`` and ``12,345,678``; LaTeX's ``1{,}000``
  too): a comma followed by exactly three digits. Any other comma between digits separates two numbers
  (``3,5`` is 3 then 5, never the decimal 3.5);
- the exponent has any number of digits: ``1e5000`` is one number, never ``1e500`` followed by ``0``.

`last_number` reads the last number of a text as a float (None when there is none, or when the last one
lies beyond the float range, such as ``1e5000``, or is longer than 64 characters: never a shorter number
cut out of it). `normalize_numbers` rewrites a text so that Math-Verify reads the numbers this grammar
reads: signs and thousands separators normalised, exponents written as ``m\\cdot 10^{e}`` (wrapped in
``\\(...\\)`` outside a math span), other digit commas followed by a space.
"""

from __future__ import annotations

import math
import re

__all__ = ["MINUS_SIGNS", "NUMBER", "foreign_digits", "last_number", "normalize_numbers", "number_tokens"]

MINUS_SIGNS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})
"""Unicode minus signs read as ASCII ``-``."""

NUMBER = re.compile(
    r"(?P<sign>[-+]?)"
    r"(?P<body>(?:[0-9]{1,3}(?:,[0-9]{3}(?![0-9]))+|[0-9]+)(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<exp>[eE][-+]?[0-9]+)?"
)
"""The number grammar (after `MINUS_SIGNS`): sign, integer part (thousands groups allowed) and fraction, exponent."""

_LATEX_THOUSANDS = re.compile(r"(?<=[0-9])\{,\}(?=[0-9]{3}(?![0-9]))")
_DIGIT_COMMA = re.compile(r"(?<=[0-9]),(?=[0-9])")
_MATH_DELIMITER = re.compile(r"\\\\|\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
_CLOSING = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
MAX_NUMBER_CHARS = 64


def foreign_digits(text: str) -> bool:
    """True when ``text`` has a character Python treats as a digit other than ASCII ``0-9`` (rejected everywhere).

    Examples:
        >>> foreign_digits("42"), foreign_digits("４2"), foreign_digits("x²"), foreign_digits("①")
        (False, True, True, True)
    """
    return any(ch.isdigit() and not "0" <= ch <= "9" for ch in text)


def _canonical(text: str) -> str:
    return _LATEX_THOUSANDS.sub(",", text.translate(MINUS_SIGNS))


def number_tokens(text: str) -> list[str]:
    """Every number of ``text`` in the grammar, as written (after the minus signs and LaTeX ``{,}`` are normalised).

    Examples:
        >>> number_tokens("1,000 apples, 3,5 pears, −2.5e3 and 1e5000")
        ['1,000', '3', '5', '-2.5e3', '1e5000']
    """
    return [m.group(0) for m in NUMBER.finditer(_canonical(text))]


def _value(token: str) -> float | None:
    if len(token) > MAX_NUMBER_CHARS:
        return None
    value = float(token.replace(",", ""))
    return value if math.isfinite(value) else None


def last_number(text: str, *, max_chars: int = 10_000) -> float | None:
    """The last number of ``text`` in the grammar, or None (see the module docstring).

    Only the last ``max_chars`` characters are scanned; a number cut by that window is not read.

    Examples:
        >>> last_number("so the answer is -12.5."), last_number("none"), last_number("\u221242"), last_number("４２")
        (-12.5, None, -42.0, None)
        >>> last_number("1,000"), last_number("3,5"), last_number("x = 1e5000"), last_number("2.5e-3")
        (1000.0, 5.0, None, 0.0025)
    """
    start = max(len(text) - max_chars, 0)
    window = _canonical(text[start:])
    if foreign_digits(window):
        return None
    found = list(NUMBER.finditer(window))
    if found and start > 0 and found[-1].start() == 0 and text[start - 1] in "0123456789.,eE+-":
        return None  # the window starts inside the last number: a cut, not a number
    return _value(found[-1].group(0)) if found else None


def _math_spans(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` spans inside ``$...$``, ``$$...$$``, ``\\(...\\)`` or ``\\[...\\]`` (an unclosed one runs to the end)."""
    spans, opened, start = [], "", 0
    for m in _MATH_DELIMITER.finditer(text):
        token = m.group(0)
        if token in ("\\\\", "\\$"):
            continue
        if not opened and token in _CLOSING:
            opened, start = token, m.end()
        elif opened and token == _CLOSING[opened]:
            spans.append((start, m.start()))
            opened = ""
    if opened:
        spans.append((start, len(text)))
    return spans


def normalize_numbers(text: str) -> str:
    """``text`` with its numbers written so Math-Verify reads them as `number_tokens` does.

    Examples:
        >>> normalize_numbers("−42, 1,000 and 3,5")
        '-42, 1000 and 3, 5'
        >>> normalize_numbers("x = 1e5000 and $2.5e-3$")
        'x = \\\\(1\\\\cdot 10^{5000}\\\\) and $2.5\\\\cdot 10^{-3}$'
    """
    text = _canonical(text)
    spans = _math_spans(text)

    def rewrite(m: re.Match[str]) -> str:
        mantissa = m.group("sign") + m.group("body").replace(",", "")
        exp = m.group("exp")
        if not exp:
            return mantissa
        power = f"{mantissa}\\cdot 10^{{{int(exp[1:])}}}"
        inside = any(a <= m.start() < b for a, b in spans)
        return power if inside else f"\\({power}\\)"

    return _DIGIT_COMMA.sub(", ", NUMBER.sub(rewrite, text))
