"""``make wait-services``: wait until the services a config's run needs answer, with progress.

    python -m experiments.wait_services --config eviback/configs/qwen3_1.7b.yaml [--wait-s 1800]
    make wait-services METHOD=eviback SCALE=1.7b [WAIT_S=1800]

A paper run's services are started in the background (``make serve-retrieval &``, ``make
serve-teacher &``) and take minutes to load (GLM-4.7-Flash's 30B weights; a 65 GB index read
into memory); the trainers probe each once before any model loads and stop when one does not
answer. This waits for them instead: it asks each again every few seconds, prints a line every
``--every-s`` seconds (30) saying what answers and why the rest do not yet, and returns as soon as
all answer (exit 0), or exit 3 once ``--wait-s`` seconds (1800) have passed, naming what did not
answer. An answer that waiting cannot change (the teacher serves another model, a 4xx from the
retrieval server, a rejected key) exits 3 at once.

The services: the retrieval server (``assets.retrieval_url``, when set: answers one query, as the
trainers' probe asks) and an LLM teacher (EviBack's, when ``teacher.enabled`` and
``teacher.backend: llm``: ``assets.teacher_endpoint`` lists ``assets.teacher_model`` under
``/models``, or, with no list, answers a one-token chat request; the key from
``assets.api_key_env`` when that variable is set). A config that names neither (CER's, ARCO's
distractor setting) has nothing to wait for: exit 0.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from common.config import ConfigError, load_config, module_parser
from common.llm_client import model_matches
from common.train.memory_plan import MemoryPlanError, config_class

PROBE_TIMEOUT_S = 10.0
POLL_S = 2.0


class Refused(Exception):
    """The service answers, and waiting will not change the answer."""


@dataclass
class Service:
    """One service to wait for: its name, URL and probe (raises ``Refused``, or any other
    exception while it is not ready yet)."""

    name: str
    url: str
    probe: Callable[[httpx.Client, float], None]
    ready_after_s: float | None = None
    last: str = "not asked yet"


def _reason(error: Exception) -> str:
    """A short phrase for why a probe failed."""
    if isinstance(error, httpx.ConnectError):
        return "not answering (connection refused)"
    if isinstance(error, httpx.TimeoutException):
        return f"not answering within {PROBE_TIMEOUT_S:.0f} s (still loading?)"
    if isinstance(error, httpx.HTTPError):
        return f"not answering ({type(error).__name__})"
    return str(error) or type(error).__name__


def retrieval_probe(url: str) -> Callable[[httpx.Client, float], None]:
    """One query, as the trainers' probe: a 200 with a ``result`` list is ready; a 4xx other
    than 408 and 429 is ``Refused`` (a wrong URL or a request the server refuses)."""

    def probe(client: httpx.Client, timeout: float) -> None:
        body = {"queries": ["wait-services probe"], "topk": 1}
        r = client.post(url, json=body, timeout=timeout)
        if r.status_code == 200 and isinstance(r.json().get("result"), list):
            return
        if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
            raise Refused(f"answers HTTP {r.status_code} ({r.text[:200].strip()}): the URL?")
        raise RuntimeError(f"answers HTTP {r.status_code}")

    return probe


def teacher_probe(
    endpoint: str, model: str, key: str = "", also: tuple[str, ...] = ()
) -> Callable[[httpx.Client, float], None]:
    """``GET /models`` lists ``model`` (``model_matches``); a list without it is ``Refused``;
    no list (404): a one-token chat request must succeed. 401/403: ``Refused``."""
    base = endpoint.rstrip("/")
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    def probe(client: httpx.Client, timeout: float) -> None:
        r = client.get(f"{base}/models", headers=headers, timeout=timeout)
        if r.status_code in (401, 403):
            raise Refused(f"refuses the key (HTTP {r.status_code})")
        if r.status_code == 200:
            served = [m.get("id", "") for m in r.json().get("data", [])]
            if any(model_matches(model, s, also) for s in served):
                return
            raise Refused(f"serves {', '.join(served) or 'no model'}, not {model}")
        if r.status_code != 404:
            raise RuntimeError(f"answers HTTP {r.status_code}")
        chat = {
            "model": model,
            "messages": [{"role": "user", "content": "ready?"}],
            "max_tokens": 1,
        }
        r = client.post(f"{base}/chat/completions", json=chat, headers=headers, timeout=timeout)
        if r.status_code == 200:
            return
        if r.status_code in (400, 401, 403, 404):
            raise Refused(f"has no /models and refuses a chat request (HTTP {r.status_code})")
        raise RuntimeError(f"answers HTTP {r.status_code}")

    return probe


def services(cfg: Any) -> list[Service]:
    """The services ``cfg``'s run asks for (the module's docstring)."""
    a = cfg.assets
    out = []
    if url := getattr(a, "retrieval_url", ""):
        out.append(Service("retrieval", url, retrieval_probe(url)))
    teacher = getattr(cfg, "teacher", None)
    llm = getattr(teacher, "enabled", False) and getattr(teacher, "backend", "") == "llm"
    endpoint, model = getattr(a, "teacher_endpoint", ""), getattr(a, "teacher_model", "")
    if llm and endpoint and model:
        key = os.environ.get(getattr(a, "api_key_env", "") or "", "")
        also = tuple(getattr(teacher, "reply_models", ()) or ())
        out.append(
            Service("teacher", f"{endpoint} ({model})", teacher_probe(endpoint, model, key, also))
        )
    return out


def wait(todo: list[Service], wait_s: float, every_s: float = 30.0) -> int:
    """Ask every service not yet ready every ``POLL_S`` seconds (``every_s`` if shorter) until
    all answer (0) or ``wait_s`` passes or one refuses (3); a line per service that answers, and
    every ``every_s`` seconds a line on those still waited for."""
    poll_s = min(POLL_S, every_s)
    start = time.monotonic()
    next_line = every_s
    with httpx.Client() as client:
        while True:
            for s in todo:
                if s.ready_after_s is not None:
                    continue
                elapsed = time.monotonic() - start
                timeout = max(0.5, min(PROBE_TIMEOUT_S, wait_s - elapsed))
                try:
                    s.probe(client, timeout)
                except Refused as e:
                    print(f"[wait] {s.name} {s.url}: {e}; waiting will not change it", flush=True)
                    return 3
                except Exception as e:  # noqa: BLE001 (not ready yet, for whatever reason)
                    s.last = _reason(e)
                    continue
                s.ready_after_s = time.monotonic() - start
                print(f"[wait] {s.name} {s.url}: answers ({s.ready_after_s:.0f} s)", flush=True)
            pending = [s for s in todo if s.ready_after_s is None]
            elapsed = time.monotonic() - start
            if not pending:
                print(f"[wait] all {len(todo)} service(s) answer ({elapsed:.0f} s)", flush=True)
                return 0
            if elapsed >= wait_s:
                what = "; ".join(f"{s.name} {s.url}: {s.last}" for s in pending)
                print(
                    f"[wait] not answering after {wait_s:.0f} s (the bound, --wait-s / "
                    f"WAIT_S): {what}",
                    flush=True,
                )
                return 3
            if elapsed >= next_line:
                what = "; ".join(f"{s.name} {s.url}: {s.last}" for s in pending)
                print(f"[wait] {elapsed:.0f} s of {wait_s:.0f}: {what}", flush=True)
                next_line += every_s
            time.sleep(max(0.0, min(poll_s, wait_s - elapsed)))


def main(argv: list[str] | None = None) -> int:
    parser = module_parser("experiments.wait_services", __doc__)
    parser.add_argument("--config", required=True, help="a config of cer/, eviback/, arco/")
    parser.add_argument("overrides", nargs="*", help="dotted key=value, as the trainers take")
    parser.add_argument("--wait-s", type=float, default=1800.0, help="the bound (seconds)")
    parser.add_argument("--every-s", type=float, default=30.0, help="a progress line this often")
    args = parser.parse_args(argv)
    if args.wait_s < 0 or args.every_s <= 0:
        parser.error("--wait-s must be >= 0 and --every-s > 0")
    try:
        cfg = load_config(config_class(args.config), args.config, args.overrides)
    except (ConfigError, MemoryPlanError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    todo = services(cfg)
    if not todo:
        print(f"[wait] {args.config} names no service to wait for")
        return 0
    names = ", ".join(f"{s.name} {s.url}" for s in todo)
    print(f"[wait] {names}: up to {args.wait_s:.0f} s", flush=True)
    return wait(todo, args.wait_s, args.every_s)


if __name__ == "__main__":
    sys.exit(main())
