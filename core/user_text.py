"""What a message shows a user of their input and of the server's files.

ComfyUI sends a node's error to the browser, which may be on another machine than the server: a message names files
by their names in the gcache folder, never by absolute server paths, and echoes what a user typed (a name, a combo
value an API client sent) cut to NAME_LIMIT characters. The nodes pass every error through `without_server_paths`
(nodes/comfy_common.py `shown_to_user`), and every message that echoes user input uses `quoted`.
"""
from __future__ import annotations

import re
from typing import Mapping

NAME_LIMIT = 80  # characters of a user's input a message echoes

_PART = r"[^\s/\\'\"()<>,;]+"  # one part of a path in a message (quotes, brackets and separators end it)
_ABSOLUTE = re.compile(rf"(?<![\w.:/\\])(?:[A-Za-z]:)?(?:[/\\]+{_PART})*[/\\]+({_PART})")
_ENDS = r"(?=[\s'\"()<>,;:]|\.(?:\s|$)|$)"  # what may follow a folder's name in a sentence


def quoted(value, limit: int = NAME_LIMIT) -> str:
    """repr(value), cut to `limit` characters with an ellipsis: a 5000-character name is not echoed in full."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def without_server_paths(text: str, folders: Mapping[str, str] = {}) -> str:
    """`text` with every absolute path replaced: a file in one of `folders` (absolute path → how a message names
    that folder) by its name relative to the folder, the folder itself by its given name, any other path by its last
    part."""
    for folder, shown in sorted(folders.items(), key=lambda f: -len(f[0])):
        head = r"(?<![\w.:/\\])" + re.escape(folder.rstrip("/\\"))
        text = re.sub(head + r"[/\\]+(?=[^\s/\\])", "", text)
        text = re.sub(head + _ENDS, lambda m: shown, text)
    return _ABSOLUTE.sub(lambda m: m.group(1), text)
