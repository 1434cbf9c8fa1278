"""A launch script's words as its command line sees them (`script_words`), for reading a
trainer's flags out of the shell scripts people launch it with (Megatron-LM's examples:
variables, bash arrays, quoted ``"--flag value"`` words, branches of an ``if``)."""

from __future__ import annotations

import re
import shlex

_SHELL_SYNTAX = frozenset(
    [
        "(",
        ")",
        "{",
        "}",
        "[[",
        "]]",
        "[",
        "]",
        "if",
        "then",
        "else",
        "elif",
        "fi",
        "do",
        "done",
        "for",
        "while",
        "case",
        "esac",
        "in",
        "||",
        "&&",
        ";",
        "!",
        "export",
        "local",
        "declare",
        "readonly",
        "set",
    ]
)
"""Words of a launch script that are shell syntax, never a flag's value."""
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\+?=(.*)$", re.S)
_VARIABLE = re.compile(
    r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
)


def _expand(word: str, env: dict[str, str]) -> str:
    """`word` with the script's variables put in: `$NAME`, `${NAME}`, `${NAME:-default}` (a
    positional `${1:-default}` takes its default); a variable the script does not set stays
    as written (an interpreted flag then says so)."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        if m.group(2) is not None:
            return _expand(m.group(2), env)
        return m.group(0)

    return _VARIABLE.sub(value, word)


def script_words(text: str) -> list[str]:
    """A launch script's words as a command line would see them: line continuations joined,
    comments dropped, shell syntax and array brackets left out, simple assignments
    (`NAME=value`, `export NAME=${NAME:-value}`) put into later words, and a word with
    spaces (a variable holding several flags, a quoted ``"--flag value"`` in an array) split
    as the shell splits an unquoted expansion. Conditions are not evaluated: the flags of
    every branch are read."""
    words = shlex.split(re.sub(r"\\\r?\n", " ", text), comments=True)
    env: dict[str, str] = {}
    out: list[str] = []
    for word in words:
        if (
            word in _SHELL_SYNTAX
            or word.endswith("=(")
            or (word.startswith("${") and "[@]" in word)
        ):
            continue  # `MODEL_ARGS=(`, `)`, `${MODEL_ARGS[@]}`
        assigned = None if word.startswith("-") else _ASSIGNMENT.match(word)
        if assigned is not None:
            if not assigned.group(2).startswith("("):
                env[assigned.group(1)] = _expand(assigned.group(2), env)
                continue
            word = assigned.group(2)[1:]  # `NAME=("--flag value"`: the array's first element
        if word.endswith(")") and word.count(")") > word.count("("):
            word = word[:-1]  # `"--num-workers 1")`: the array's last element
        word = _expand(word, env)
        if any(c.isspace() for c in word):  # "$GPT_ARGS", "--fp8-format hybrid" in an array:
            out += _split(word)  # split as the shell splits an unquoted expansion
        elif word:
            out.append(word)
    return out


def _split(word: str) -> list[str]:
    """`word`'s words (shell quoting kept; on a stray quote, at whitespace)."""
    try:
        return shlex.split(word)
    except ValueError:
        return word.split()
