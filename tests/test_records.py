"""The repository's records say what changed and why, never the working sessions they came
from."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
SKIP_DIRS = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache", ".whl",
             "build", "dist"}
WORD = re.compile(r"\bsessions?[ -]\d", re.IGNORECASE)


def _text_files():
    for path in ROOT.rglob("*"):
        parts = set(path.relative_to(ROOT).parts)
        if (path.is_file() and not parts & SKIP_DIRS
                and not any(p.endswith(".egg-info") for p in parts)):
            data = path.read_bytes()
            if b"\0" not in data[:4096]:
                yield path, data.decode("utf-8", errors="replace")


def test_no_record_names_a_session_number():
    found = [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
             for path, text in _text_files() for m in WORD.finditer(text)]
    assert not found, "say what changed instead of a session number:\n" + "\n".join(found[:20])


def test_the_pattern_catches_the_forms_used_before():
    n = "36"  # kept apart from the word, so that this file passes its own check
    for text in (f"since Session {n}", f"(sessions {n}, 31)", f"the session-{n} default"):
        assert WORD.search(text)
    assert not WORD.search("this session's run, the sessions' records")
