"""Where a model setting (``assets.model=...``) points, resolved before any run folder opens or
model loads: a local HF folder, a hub id already in the Hugging Face cache, or (online) a hub id
the hub knows. Anything else is one line saying which and what to do, instead of a traceback
from ``from_pretrained`` after a minute of retries.

``model_problem`` never downloads anything; online it asks the hub once whether the id exists
(``HF_HUB_OFFLINE=1``: only the cache is looked at).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# owner/name as the hub spells repo ids (a single slash; no leading dot or slash)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_LOCAL_PREFIXES = ("/", "./", "../", "~", "runs/")
_HUB_TIMEOUT_S = 10.0


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it (from the environment now, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_cache_dir() -> Path:
    """The hub cache huggingface_hub uses: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
    ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def in_hub_cache(model_id: str) -> bool:
    """The config.json of hub id ``model_id`` lies in the local hub cache."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model_id, "config.json", cache_dir=str(hub_cache_dir()))
    return isinstance(found, str)


def model_problem(model: str, key: str = "assets.model") -> str | None:
    """None when ``model`` can be loaded (a local HF folder, a cached hub id, or online a hub id
    the hub has); otherwise one line naming ``key``, the value and what to do."""
    if not model:
        return f"{key} is empty: give a local HF model folder or a hub id (owner/name)"
    reason = model_reason(model)
    return None if reason is None else f"{key}: {model!r} {reason}"


def model_reason(model: str) -> str | None:
    """Why ``model`` cannot be loaded, as a phrase after its name (None: it can)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return "is a folder without config.json (not an HF model folder)"
        return None
    if path.exists():
        return "is a file, not an HF model folder"
    if not HUB_ID.fullmatch(model) or model.startswith(_LOCAL_PREFIXES):
        return "not found: no such folder (and no hub id of the form owner/name)"
    if in_hub_cache(model):
        return None
    neither = "is no local folder and not in the Hugging Face cache"
    if hub_offline():
        return (
            f"{neither} ({hub_cache_dir()}), and HF_HUB_OFFLINE is set: download it where the "
            f"network is (`hf download {model}`) or give a local folder"
        )
    return _ask_hub(model, neither)


def _ask_hub(model: str, neither: str) -> str | None:
    """Online: does the hub have ``model``? (one metadata request, nothing downloaded)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(model, timeout=_HUB_TIMEOUT_S)
    except GatedRepoError:
        return None  # it exists; from_pretrained says what access it needs
    except RepositoryNotFoundError:
        return (
            f"{neither}, and the hub has no model of that name (a typo, a private repo: "
            "`hf auth login`, or a local path that does not exist)"
        )
    except Exception as err:  # no network, a proxy, a timeout: the hub cannot answer
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        return (
            f"{neither}, and the hub cannot be reached ({type(err).__name__}: {reason}): "
            "check the network, or set HF_HUB_OFFLINE=1 with the model in the cache, or give "
            "a local folder"
        )
    return None


__all__ = [
    "HUB_ID",
    "hub_cache_dir",
    "hub_offline",
    "in_hub_cache",
    "model_problem",
    "model_reason",
]
