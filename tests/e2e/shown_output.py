"""What a document shows an example printing, checked against what it printed: text as shown
(whitespace aside), each number to the digits shown, `...` for whatever the document leaves
out (ids, timestamps, long lists)."""

import re
from decimal import Decimal

from tests.e2e.reference import TOLERANCE

NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
PIECES = re.compile(rf"(\.\.\.|{NUMBER}|\s+)")


def shown_pattern(shown: str) -> tuple[re.Pattern, list[str]]:
    """A pattern of the shown text, with a group per shown number, and those numbers."""
    regex, numbers = [], []
    for piece in PIECES.split(shown.strip()):
        if piece == "...":
            regex.append(r".*?")
        elif re.fullmatch(NUMBER, piece):
            regex.append(f"({NUMBER})")
            numbers.append(piece)
        elif piece.isspace():
            regex.append(r"\s*")
        elif piece:
            regex.append(re.escape(piece))
    return re.compile("".join(regex), re.DOTALL), numbers


def half_unit(number: str) -> float:
    """Half a unit of the number's last digit: how far rounding to it moves a value."""
    return 0.5 * 10.0 ** Decimal(number).as_tuple().exponent


def same_number(shown: str, printed: str) -> bool:
    """Equal to the digits shown: a shown -0.258 is any of -0.2575..-0.2585 and the float
    noise beside it (TOLERANCE), and a printed number rounded in turn may be half its own last
    digit off; a shown integer is that integer."""
    if re.fullmatch(r"-?\d+", shown):
        return shown == printed
    return abs(float(shown) - float(printed)) <= half_unit(shown) + half_unit(printed) + TOLERANCE


def mismatch(shown: str, printed: str) -> str | None:
    """Why `printed` is not what is shown, or None."""
    pattern, numbers = shown_pattern(shown)
    match = pattern.fullmatch(printed.strip())
    if match is None:
        return "the text differs"
    for index, (expected, got) in enumerate(zip(numbers, match.groups(), strict=True)):
        if not same_number(expected, got):
            return f"number {index + 1}: shown {expected}, printed {got}"
    return None
