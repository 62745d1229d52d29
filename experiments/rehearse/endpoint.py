"""A stand-in OpenAI-compatible LLM endpoint for rehearsals: each contract the project's LLM
clients speak, answered by a small rule, with configured shares of failures.

    with serve_endpoint(malformed=0.1, http_503=0.05, seed=0) as base_url:  # ".../v1"
        client = LLMClient(base_url, "standin", timeout=2.0)

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /stats`` (request counts by
contract and outcome, JSON). A request's contract is recognised by the distinctive text of its
prompt (``CONTRACTS``: the marker each client's prompt builder writes; the tests check the
markers against those builders):

- ``eviback_stage_a`` / ``eviback_stage_b``: EviBack's two-stage teacher (eviback.prompts): a
  ``<reason>…</reason><status>…</status><answer>…</answer>`` verdict. Stage A: supported when
  exactly one of the rehearsal answers (``assets.QA_ANSWERS``) occurs in the documents,
  ambiguous when several do, insufficient when none; stage B: supported with the first
  candidate that occurs in the documents, else with a rehearsal answer that does, else
  insufficient.
- ``eviback_labeller``: E2E-APE's labelling request (eviback.ape.LABELLER_INSTRUCTION), a
  verdict as stage B gives from the reference answers.
- ``ape_controller``: E2E-APE's request for prompt ids (eviback.ape_run.controller_candidates):
  k ids on the axes, one a line, varying the named default's instruction, few-shot, titles and
  order. ``ape_writer``: its request for instruction texts: k ``<instruction>…</instruction>``.
- ``arco_player``: ARCO's LLM warmup player (arco.teacher.teacher_policy_messages): a ReAct turn,
  ``Action: Finish[answer]`` once a rehearsal answer occurs in an observation (or no searches
  remain), else ``Action: Search[query]`` (the question first, then a capitalised phrase of the
  last observation).
- ``arco_annotator``: ARCO's hindsight annotator (arco.teacher.annotation_messages): a JSON list,
  one object per step with k criteria and k scores, every score R / n so that the step means add
  up to R.

Outcomes: each request draws one from a seeded RNG keyed by the seed, the request body and how
many times that body came before (so a run's outcomes do not depend on thread timing, and a
retry draws afresh): ``malformed`` (HTTP 200, content that breaks the contract), ``bad_body``
(HTTP 200 without ``choices``), ``http_500``, ``http_503``, ``timeout`` (a valid answer after
``timeout_delay_s``, past the client's timeout) with their shares, else ``ok``. A request that
is not a chat request, or whose contract is not recognised, gets HTTP 400 naming what was not
recognised (counted under ``unrecognised``).

Faults beside the shares (fault injection for the clients' guards): ``fail_only`` applies the
shares to some contracts only (``("eviback_stage_b",)``: the gold-aware stage down, stage A
well); ``fail_matching`` to the requests whose prompt holds one of the strings only (e.g. the
questions of a later step: a teacher that goes down mid-run); ``reply_model`` answers as another
model (the reply's ``model`` field; by default the one asked for); ``usage=False`` sends no
``usage``; ``answers`` replaces the rehearsal answers the stage A/B rules look for (e.g. the tiny
world's, so that stage A finds evidence and stage B is asked).

CLI: ``python -m experiments.rehearse.endpoint --port 8001 [--malformed 0.1 ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from experiments.rehearse.assets import QA_ANSWERS

# contract -> the text its client's prompt carries (checked in this order)
CONTRACTS: dict[str, tuple[str, ...]] = {
    "arco_player": ("You are a search agent answering a multi-hop question.",),
    "arco_annotator": ("You annotate a finished trajectory of a search agent in hindsight.",),
    "eviback_labeller": ("You label evidence for a benchmark of search-agent evidence.",),
    "ape_controller": ("prompt of an evidence judge. A prompt is named",),
    "ape_writer": ("We tune the instruction of an evidence judge",),
    "eviback_stage_b": (
        "Reply with exactly these three elements",
        "Candidate answer to check (a claim, not evidence",
    ),
    "eviback_stage_a": ("Reply with exactly these three elements",),
}
UNRECOGNISED = "unrecognised"
FAILURES = ("malformed", "bad_body", "http_500", "http_503", "timeout")
OUTCOMES = ("ok", *FAILURES, "http_400")

MALFORMED = {
    "eviback_stage_a": "The documents look fine to me.",
    "eviback_stage_b": "<status>supported_answer</status> I agree with the candidate.",
    "eviback_labeller": "These documents probably answer it.",
    "ape_controller": "I would try a few different prompts.",
    "ape_writer": "Try being more careful.",
    "arco_player": "I am not sure what to do next.",
    "arco_annotator": "The agent did reasonably well overall.",
}


@dataclass(frozen=True)
class Shares:
    """The share of requests given each failure outcome; the rest are answered validly."""

    malformed: float = 0.0
    bad_body: float = 0.0
    http_500: float = 0.0
    http_503: float = 0.0
    timeout: float = 0.0

    def __post_init__(self) -> None:
        for name in FAILURES:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"stand-in endpoint: share {name}={value} is not in [0, 1]")
        total = sum(getattr(self, n) for n in FAILURES)
        if total > 1.0 + 1e-9:
            raise ValueError(f"stand-in endpoint: the failure shares add up to {total:g} > 1")

    def draw(self, u: float) -> str:
        """The outcome of a uniform draw ``u`` in [0, 1)."""
        edge = 0.0
        for name in FAILURES:
            edge += getattr(self, name)
            if u < edge:
                return name
        return "ok"


class UnrecognisedRequest(ValueError):
    """A request none of the contracts fits."""


# --- recognising and answering -------------------------------------------------------------


def recognise(messages: list[dict[str, Any]]) -> str:
    """The contract of a chat request (a key of ``CONTRACTS``), or ``UnrecognisedRequest``."""
    text = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    for contract, markers in CONTRACTS.items():
        if all(marker in text for marker in markers):
            return contract
    start = " ".join(text.split())[:80]
    raise UnrecognisedRequest(
        f"no known contract's prompt text in the messages (they start {start!r}); known "
        f"contracts: {', '.join(CONTRACTS)}"
    )


def _occurs(needle: str, text: str) -> bool:
    """``needle`` in ``text`` on word boundaries, case-insensitively."""
    if not needle.strip():
        return False
    return re.search(rf"(?<!\w){re.escape(needle.strip())}(?!\w)", text, re.I) is not None


def _after(text: str, marker: str) -> str:
    i = text.rfind(marker)
    return text[i + len(marker) :] if i >= 0 else ""


def _verdict(status: str, answer: str, reason: str) -> str:
    return f"<reason>{reason}</reason><status>{status}</status><answer>{answer}</answer>"


def _judge(references: list[str], documents: str, answers: Sequence[str] = QA_ANSWERS) -> str:
    """Stage B's and the labeller's verdict: a reference the documents state, else another
    rehearsal answer they state, else insufficient."""
    for answer in [*references, *answers]:
        if _occurs(answer, documents):
            return _verdict("supported_answer", answer.strip(), f"A document states {answer}.")
    return _verdict("insufficient_evidence", "", "No document states the answer.")


def answer_eviback_stage_a(text: str, answers: Sequence[str] = QA_ANSWERS) -> str:
    documents = _after(text, "\nDocuments:\n")
    found = [a for a in answers if _occurs(a, documents)]
    if not found:
        return _verdict("insufficient_evidence", "", "No document states an answer.")
    if len(found) > 1:
        return _verdict("ambiguous_evidence", "", f"The documents name {' and '.join(found)}.")
    return _verdict("supported_answer", found[0], f"A document states {found[0]}.")


def answer_eviback_stage_b(text: str, answers: Sequence[str] = QA_ANSWERS) -> str:
    line = _after(text, "Candidate answer to check").split("\n", 1)[0]
    references = re.findall(r'"([^"]*)"', line.split(":", 1)[-1])
    return _judge(references, _after(text, "\nDocuments:\n"), answers)


def answer_eviback_labeller(text: str) -> str:
    line = _after(text, "\nReference answers: ").split("\n", 1)[0]
    return _judge([r.strip() for r in line.split("|")], _after(text, "\nDocuments:\n"))


_PROMPT_ID = re.compile(
    r"(?P<stage>[AB])-(?P<instruction>[a-z_]+)-(?P<rule>[a-z_]+)-fs(?P<fs>[01])-q(?P<q>[01])"
    r"-t(?P<t>[01])-(?P<order>[a-z]+)-m(?P<m>\d+)"
)


def answer_ape_controller(text: str) -> str:
    """k prompt ids around the named default: other instructions, few-shot, titles, order."""
    default = _PROMPT_ID.search(_after(text, "A prompt is named"))
    k = int((re.search(r"Propose (\d+) ", text) or ["", "4"])[1])
    listed = re.search(r"Instructions: ([a-z_, ]+)\.", text)
    if default is None:
        return "(no default prompt id to vary)"
    g = default.groupdict()
    instructions = [g["instruction"]]
    if listed:
        instructions += [i.strip() for i in listed[1].split(",") if i.strip() != g["instruction"]]
    names: list[str] = []
    for fs in ("1", "0"):
        for order in ("reverse", "rank"):
            for t in (g["t"], str(1 - int(g["t"]))):
                for instruction in instructions:
                    name = (
                        f"{g['stage']}-{instruction}-{g['rule']}-fs{fs}-q{g['q']}-t{t}"
                        f"-{order}-m{g['m']}"
                    )
                    if name != default[0] and name not in names:
                        names.append(name)
    return "\n".join(names[:k])


def answer_ape_writer(text: str) -> str:
    stage = (re.search(r"\(stage ([AB])", text) or ["", "A"])[1]
    k = int((re.search(r"Write (\d+) alternative", text) or ["", "2"])[1])
    role = "without the reference answer" if stage == "A" else "given a candidate answer to test"
    texts = [
        f"You judge, {role}, the documents a search agent retrieved for a question (variant "
        f"{i + 1}). Decide from these documents alone whether they support one complete answer, "
        "miss a needed fact, or support several incompatible answers; your own knowledge does "
        "not count."
        for i in range(k)
    ]
    return "\n".join(f"<instruction>{t}</instruction>" for t in texts)


_CAPITALISED = re.compile(r"\b[A-Z][\w'-]*(?: [A-Z][\w'-]*)*")


def answer_arco_player(text: str) -> str:
    """A ReAct turn: finish with a rehearsal answer seen in an observation, else search."""
    question = (
        text[text.find("Question: ") + len("Question: ") :]
        .split("\n\nTrajectory so far:", 1)[0]
        .strip()
    )
    trajectory = _after(text, "Trajectory so far:\n").split("\n\nSearches remaining:", 1)[0]
    observations = [
        line[len("Observation: ") :]
        for line in trajectory.split("\n")
        if line.startswith("Observation: ")
    ]
    found = [a for a in QA_ANSWERS if any(_occurs(a, o) for o in observations)]
    if found or "No searches remain" in text:
        answer = found[0] if found else QA_ANSWERS[0]
        return f"Thought: the documents point to {answer}.\nAction: Finish[{answer}]"
    asked = re.findall(r"Search\[(.*)\]", trajectory)
    query = question
    if asked:
        last = observations[-1] if observations else ""
        phrases = [p for p in _CAPITALISED.findall(last) if p not in question and p not in asked]
        query = max(phrases, key=len) if phrases else f"{question} {len(asked) + 1}"
    return f"Thought: I need to look this up.\nAction: Search[{query}]"


_CRITERIA = (
    "query targets the missing fact",
    "gathers new evidence",
    "avoids redundant searches",
    "answer is supported",
    "plans the next hop",
)


def answer_arco_annotator(text: str) -> str:
    """k criteria and k scores R / n per step (n steps), so sum_t mean_k score = R."""
    k = int((re.search(r"For every step write (\d+) short criteria", text) or ["", "3"])[1])
    n = int((re.search(r"for each of the (\d+) steps", text) or ["", "1"])[1])
    reward = float((re.search(r"Final reward R = ([-+0-9.eE]+)", text) or ["", "0"])[1])
    score = reward / max(n, 1)
    criteria = [
        _CRITERIA[i % len(_CRITERIA)] + ("" if i < len(_CRITERIA) else f" {i}") for i in range(k)
    ]
    steps = [{"step": t, "criteria": criteria, "scores": [score] * k} for t in range(1, n + 1)]
    return json.dumps(steps)


ANSWERERS = {
    "eviback_stage_a": answer_eviback_stage_a,
    "eviback_stage_b": answer_eviback_stage_b,
    "eviback_labeller": answer_eviback_labeller,
    "ape_controller": answer_ape_controller,
    "ape_writer": answer_ape_writer,
    "arco_player": answer_arco_player,
    "arco_annotator": answer_arco_annotator,
}


def answer(
    contract: str, messages: list[dict[str, Any]], answers: Sequence[str] = QA_ANSWERS
) -> str:
    """The valid reply to a request of ``contract`` (``answers``: what EviBack's stage A and B
    rules look for in the documents)."""
    text = "\n".join(str(m.get("content", "")) for m in messages)
    if contract in ("eviback_stage_a", "eviback_stage_b"):
        return ANSWERERS[contract](text, answers)
    return ANSWERERS[contract](text)


# --- the app -------------------------------------------------------------------------------


class StandinEndpoint:
    """The app and its counts; ``app`` is the FastAPI application."""

    def __init__(
        self,
        shares: Shares = Shares(),
        seed: int = 0,
        timeout_delay_s: float = 5.0,
        served: Sequence[str] = (),
        *,
        fail_only: Sequence[str] = (),
        fail_matching: Sequence[str] = (),
        reply_model: str = "",
        usage: bool = True,
        answers: Sequence[str] = QA_ANSWERS,
    ) -> None:
        unknown = sorted(set(fail_only) - set(CONTRACTS))
        if unknown:
            raise ValueError(f"stand-in endpoint: fail_only names unknown contracts {unknown}")
        if timeout_delay_s <= 0:
            raise ValueError(
                f"stand-in endpoint: timeout_delay_s must be > 0, got {timeout_delay_s}"
            )
        self.shares, self.seed, self.timeout_delay_s = shares, seed, timeout_delay_s
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}
        self._counts = {c: dict.fromkeys(OUTCOMES, 0) for c in (*CONTRACTS, UNRECOGNISED)}
        self._models: dict[str, int] = {}
        self.served = tuple(served)  # listed by GET /v1/models beside "standin" and those asked
        self.fail_only, self.fail_matching = tuple(fail_only), tuple(fail_matching)
        self.reply_model, self.usage, self.answers = reply_model, usage, tuple(answers)
        self.app = self._build()

    def stats(self) -> dict[str, Any]:
        """Counts by contract and outcome (every contract, zeros included), by model, totals."""
        with self._lock:
            by_contract = {c: dict(o) for c, o in self._counts.items()}
            models = dict(self._models)
        outcomes = {o: sum(c[o] for c in by_contract.values()) for o in OUTCOMES}
        return {
            "requests": sum(outcomes.values()),
            "by_outcome": outcomes,
            "by_contract": by_contract,
            "by_model": models,
            "shares": {n: getattr(self.shares, n) for n in FAILURES},
            "seed": self.seed,
            "timeout_delay_s": self.timeout_delay_s,
            "fail_only": list(self.fail_only),
            "fail_matching": len(self.fail_matching),
            "reply_model": self.reply_model,
            "usage": self.usage,
        }

    def _count(self, contract: str, outcome: str, model: str | None = None) -> None:
        with self._lock:
            self._counts[contract][outcome] += 1
            if model is not None:
                self._models[model] = self._models.get(model, 0) + 1

    def _outcome(self, body: dict[str, Any], contract: str = "", text: str = "") -> str:
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        with self._lock:
            n = self._seen.get(digest, 0)
            self._seen[digest] = n + 1
        if self.fail_only and contract not in self.fail_only:
            return "ok"
        if self.fail_matching and not any(m in text for m in self.fail_matching):
            return "ok"
        return self.shares.draw(random.Random(f"{self.seed}:{digest}:{n}").random())

    def _build(self) -> FastAPI:
        app = FastAPI(title="rehearsal stand-in LLM endpoint")

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            with self._lock:
                names = sorted({"standin", *self.served, *self._models})
            return {"object": "list", "data": [{"id": n, "object": "model"} for n in names]}

        @app.get("/stats")
        async def stats() -> dict[str, Any]:
            return self.stats()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            try:
                body = json.loads(await request.body())
                messages = body.get("messages") if isinstance(body, dict) else None
                if not isinstance(messages, list) or not messages:
                    raise UnrecognisedRequest("the body has no non-empty 'messages' list")
                if not all(isinstance(m, dict) for m in messages):
                    raise UnrecognisedRequest("'messages' holds an item that is not an object")
                contract = recognise(messages)
            except (ValueError, UnrecognisedRequest) as e:  # JSONDecodeError is a ValueError
                self._count(UNRECOGNISED, "http_400")
                what = str(e) if isinstance(e, UnrecognisedRequest) else f"invalid JSON body ({e})"
                return JSONResponse(
                    {
                        "error": {
                            "message": f"stand-in endpoint cannot recognise the request: {what}"
                        }
                    },
                    status_code=400,
                )
            model = str(body.get("model", ""))
            text = "\n".join(str(m.get("content", "")) for m in messages)
            outcome = self._outcome(body, contract, text)
            self._count(contract, outcome, model)
            if outcome in ("http_500", "http_503"):
                code = int(outcome[-3:])
                message = f"stand-in endpoint: injected HTTP {code} ({contract})"
                return JSONResponse({"error": {"message": message}}, status_code=code)
            if outcome == "bad_body":
                return JSONResponse({"id": "chatcmpl-standin", "object": "chat.completion"})
            if outcome == "timeout":
                deadline = time.monotonic() + self.timeout_delay_s
                while time.monotonic() < deadline and not await request.is_disconnected():
                    await asyncio.sleep(0.05)
            content = (
                MALFORMED[contract]
                if outcome == "malformed"
                else answer(contract, messages, self.answers)
            )
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
            completion_tokens = len(content.split())
            reply = {
                "id": f"chatcmpl-standin-{contract}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.reply_model or model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
            }
            if self.usage:
                reply["usage"] = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
            return JSONResponse(reply)

        return app


def _server(app: FastAPI) -> Any:
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


@contextlib.contextmanager
def serve_endpoint(
    malformed: float = 0.0,
    bad_body: float = 0.0,
    http_500: float = 0.0,
    http_503: float = 0.0,
    timeout: float = 0.0,
    *,
    seed: int = 0,
    timeout_delay_s: float = 5.0,
    host: str = "127.0.0.1",
    port: int = 0,
    served: Sequence[str] = (),
    **faults: Any,
) -> Iterator[str]:
    """Serve the stand-in endpoint from a background thread on a socket bound up front
    (``port=0``: a free one); yields the base URL ``http://host:port/v1`` and stops on exit.
    ``served``: model names ``GET /v1/models`` lists (a client's probe looks for its model);
    ``faults``: ``StandinEndpoint``'s ``fail_only``, ``fail_matching``, ``reply_model``,
    ``usage``, ``answers``."""
    endpoint = StandinEndpoint(
        Shares(malformed, bad_body, http_500, http_503, timeout),
        seed,
        timeout_delay_s,
        served,
        **faults,
    )
    sock = socket.socket()
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"stand-in endpoint: cannot listen on {host}:{port}: {e.strerror}") from None
    server = _server(endpoint.app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError(f"stand-in endpoint on {host}:{sock.getsockname()[1]} did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.rehearse.endpoint", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-delay", type=float, default=5.0, help="seconds a timeout waits")
    parser.add_argument(
        "--served-model",
        action="append",
        default=[],
        dest="served",
        help="a model name GET /v1/models lists (repeatable)",
    )
    parser.add_argument(
        "--fail-only",
        action="append",
        default=[],
        choices=list(CONTRACTS),
        help="apply the failure shares to this contract only (repeatable)",
    )
    parser.add_argument("--reply-model", default="", help="answer as this model")
    parser.add_argument("--no-usage", action="store_true", help="send no usage in the answers")
    for name in FAILURES:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=float,
            default=0.0,
            dest=name,
            help=f"share of requests answered with {name}",
        )
    args = parser.parse_args(argv)
    try:
        endpoint = StandinEndpoint(
            Shares(*(getattr(args, n) for n in FAILURES)),
            args.seed,
            args.timeout_delay,
            args.served,
            fail_only=args.fail_only,
            reply_model=args.reply_model,
            usage=not args.no_usage,
        )
    except ValueError as e:
        parser.error(str(e))
    sock = socket.socket()
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror}")
        return 2
    print(f"stand-in LLM endpoint on http://{args.host}:{args.port}/v1", flush=True)
    _server(endpoint.app).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
