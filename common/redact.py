"""Credentials out of what a run writes down: ``http://user:KEY@host`` -> ``http://user:***@host``,
``?api_key=KEY`` -> ``?api_key=***``.

Used on everything that dumps settings or the command line (``config.yaml``, ``env.json``,
``config_changes.jsonl``, log lines naming an endpoint). Only the secret is masked; the scheme,
user, host, path and the other query parameters stay readable.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
# scheme://user:password@  (the password runs up to the last '@' before the host part)
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^/\s@]*(?=@)")
# scheme://token@  (a bare token as the user, e.g. https://KEY@host): only when it looks secret
_TOKEN_USER = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]{16,})(?=@)")
_SECRET_PARAMS = (
    "api_key",
    "apikey",
    "api-key",
    "key",
    "token",
    "access_token",
    "auth",
    "password",
    "secret",
    "sig",
    "signature",
)
_QUERY = re.compile(
    r"(?P<head>[?&;](?:" + "|".join(map(re.escape, _SECRET_PARAMS)) + r")=)[^&;#\s'\"]*",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with every URL password, long token-as-user and secret query value masked."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: m.group("head") + MASK, text)
    text = _TOKEN_USER.sub(lambda m: m.group("head") + MASK, text)
    return _QUERY.sub(lambda m: m.group("head") + MASK, text)


def redact_secrets(value: Any) -> Any:
    """``value`` with ``redact`` applied to every string inside dicts, lists and tuples."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_secrets(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_secrets(v) for v in value)
    return value
