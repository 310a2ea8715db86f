"""The three FTS5 indexes over ``messages``: CJK index text, damage handling and rebuilds.

The indexes are derived data; ``sessions`` and ``messages`` are the record. So:

* Index text for CJK is computed here, in Python, when a row is written (``search_cjk``): each
  run of CJK characters is spelled as its overlapping bigrams followed by its last character
  (``東京都`` → ``東京 京都 都``), everything else is kept as it is. The plain ``unicode61``
  tokenizer then indexes bigrams as tokens, so a 2-character term is one token lookup, a longer
  term is a phrase of bigrams, and a 1-character term is a prefix query on the bigrams (the
  trailing unigram catches a character that ends a run). No tokenizer extension is needed, and
  any connection — the ``sqlite3`` shell included — can read the database and run the triggers.
* When FTS damage is proven (see :func:`damage_is_fts_only`), :func:`detach_index` sets the
  persistent ``fts_stale`` marker and drops the sync triggers in one transaction; canonical
  writes carry on without the index and searches fall back to LIKE over canonical rows.
  Nothing on that path rebuilds.
* A rebuild runs in chunks in id order. ``fts_rebuild_high_water`` (the highest message id when
  it started) and ``fts_rebuild_progress`` (the last id indexed) gate the triggers, so rows the
  rebuild has not reached yet are left to it, rows it has passed and rows newer than the high
  water are kept in sync by the triggers: nothing is indexed twice or missed, even with other
  writers running meanwhile. Only a writable open that holds the cross-process admission lock
  and sees no other process on the database starts one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = [
    "CJK_CHAR_CLASS",
    "cjk_index_text",
    "cjk_bigrams",
    "has_cjk",
]

# Letters of the scripts written without spaces between words (plus Hangul, which is written
# with spaces but whose syllable blocks users search for in fragments). Punctuation in these
# blocks (、。・「」 and the like) is deliberately absent: it separates runs.
CJK_CHAR_CLASS = (
    "\u1100-\u11ff"  # Hangul Jamo
    "\u3005-\u3007"  # 々 〆 〇
    "\u3041-\u309f"  # Hiragana
    "\u30a1-\u30fa\u30fc-\u30ff"  # Katakana (without ・)
    "\u3105-\u312f"  # Bopomofo
    "\u3131-\u318e"  # Hangul Compatibility Jamo
    "\u31f0-\u31ff"  # Katakana Phonetic Extensions
    "\u3400-\u4dbf"  # CJK Extension A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\ua960-\ua97f"  # Hangul Jamo Extended-A
    "\uac00-\ud7a3"  # Hangul Syllables
    "\ud7b0-\ud7ff"  # Hangul Jamo Extended-B
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\uff66-\uff9f"  # Halfwidth Katakana
    "\U00020000-\U0003134f"  # CJK Extensions B–G
)
_CJK_RUN_RE = re.compile(f"[{CJK_CHAR_CLASS}]+")


def has_cjk(text: str | None) -> bool:
    return bool(text) and _CJK_RUN_RE.search(text) is not None


def cjk_bigrams(run: str) -> list[str]:
    """The overlapping bigrams of a CJK run; a single character is its own token."""
    if len(run) < 2:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def _index_tokens(run: str) -> str:
    if len(run) < 2:
        return run
    return " ".join(cjk_bigrams(run)) + " " + run[-1]


def cjk_index_text(*parts: str | None) -> str | None:
    """The ``search_cjk`` value for a row whose indexed text is ``parts`` (None: no CJK)."""
    text = "\n".join(p for p in parts if p)
    if not has_cjk(text):
        return None
    return _CJK_RUN_RE.sub(lambda m: f" {_index_tokens(m.group(0))} ", text)


def iter_cjk_runs(text: str) -> Iterator[re.Match[str]]:
    return _CJK_RUN_RE.finditer(text)
