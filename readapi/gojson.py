"""JSON as kube-apiserver writes it: the object type the read API's bodies are, and Go's
encoding of them.

Upstream writes its bodies with Go's ``encoding/json``, which escapes what Python's
:func:`json.dumps` leaves as it is (the HTML characters, the line and paragraph
separators), and quotes a value in a field error the same way; :func:`go_json` and
:func:`go_json_body` write as it does.
"""

from __future__ import annotations

import json
from typing import Any, Final, TypeAlias

JSON: TypeAlias = dict[str, Any]

# What Go's json.Marshal escapes that Python's json.dumps leaves as it is.
_GO_ESCAPES: Final = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
_HTML_CHARACTERS: Final = "".join(map(chr, _GO_ESCAPES))


def go_json(value: Any) -> str:
    """``value`` as Go's ``json.Marshal`` writes it (how upstream's field errors show
    a value of a named string type, and its bodies): compact, UTF-8 kept, HTML
    characters escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if any(character in text for character in _HTML_CHARACTERS):
        return text.translate(_GO_ESCAPES)
    return text


def go_json_body(value: Any) -> bytes:
    """A JSON response body as upstream's encoder writes it: :func:`go_json`, then a
    newline (a lone surrogate, which no request or event holds, written as ``?``)."""
    return (go_json(value) + "\n").encode("utf-8", "replace")
