"""The `llm` rewriter: any OpenAI-compatible endpoint rewrites a problem so its answer is an integer.

The prompt is few-shot chain of thought in the four steps DAPO describes for building DAPO-Math-17K (paper,
sec. 4 / appendix): (1) identify the form of the original answer, (2) choose an integer-valued expression of
the form's parameters, (3) rewrite the problem to ask for it, (4) compute the new integer. The model ends with
a JSON object {problem, answer, form, params, target}; the verifier (forms.py) then decides, never the model.

Requests run concurrently (asyncio, `concurrency` in flight), retry with exponential backoff and jitter on
429, 5xx, timeouts, dropped connections and unreadable responses, and every completed response is appended to
an on-disk cache keyed by the request (model, messages, sampling settings): a rerun after a crash, or after a
change to a later stage, sends no request twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from data_pipeline.config import BuildConfig
from data_pipeline.forms import Rewrite

SYSTEM_PROMPT = (
    "You rewrite competition math problems so that their answer is a single integer, without changing the "
    "mathematics. Work in four steps: 1. Identify the form of the original answer. 2. Choose integer "
    "parameters "
    "that determine it uniquely (relatively prime, square-free radicand) and an integer expression of them. "
    "3. Rewrite the problem: keep it word for word and append a sentence asking for that integer, in the "
    "style of "
    "AIME. 4. Compute the new integer answer. End with one JSON object on the last line: "
    '{"problem": rewritten problem, "answer": integer, "form": the answer as an expression of the parameters '
    '(use sqrt() and pi, e.g. "(a+b*sqrt(c))/d"), "params": {name: integer}, "target": the expression asked '
    "for}."
)
FEW_SHOT = [
    (
        "Simplify $11-\\sqrt{24}$.",
        "11-2\\sqrt{6}",
        "1. The answer 11-2*sqrt(6) has the form k-m*sqrt(n) with k=11, m=2, n=6 (6 is square-free).\n"
        "2. With n square-free the parameters are unique, so k+m+n is a well-defined integer.\n"
        "3. Append: The answer can be written as $k-m\\sqrt{n}$, where $k$, $m$, $n$ are positive integers "
        "and $n$ is "
        "not divisible by the square of any prime. Find $k+m+n$.\n4. 11+2+6 = 19.\n"
        '{"problem": "Simplify $11-\\\\sqrt{24}$. The answer can be written as $k-m\\\\sqrt{n}$, where $k$, '
        "$m$, $n$ are "
        'positive integers and $n$ is not divisible by the square of any prime. Find $k+m+n$.", "answer": '
        "19, "
        '"form": "k-m*sqrt(n)", "params": {"k": 11, "m": 2, "n": 6}, "target": "k+m+n"}',
    ),
    (
        "A fair coin is flipped 3 times. What is the probability of exactly two heads? Express your answer "
        "as a common fraction.",
        "\\frac{3}{8}",
        "1. The answer 3/8 has the form m/n with m=3, n=8 relatively prime.\n2. Ask for m+n.\n"
        "3. Drop the instruction about a common fraction and append the AIME sentence.\n4. 3+8 = 11.\n"
        '{"problem": "A fair coin is flipped 3 times. The probability of exactly two heads is '
        "$\\\\frac{m}{n}$, where "
        '$m$ and $n$ are relatively prime positive integers. Find $m+n$.", "answer": 11, "form": "m/n", '
        '"params": {"m": 3, "n": 8}, "target": "m+n"}',
    ),
]

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


def build_messages(problem: str, answer: str) -> list[dict[str, str]]:
    """System prompt, the few-shot pairs, then this problem and its original answer."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for shot_problem, shot_answer, shot_reply in FEW_SHOT:
        messages.append(
            {"role": "user", "content": f"Problem: {shot_problem}\nOriginal answer: {shot_answer}"}
        )
        messages.append({"role": "assistant", "content": shot_reply})
    messages.append({"role": "user", "content": f"Problem: {problem}\nOriginal answer: {answer}"})
    return messages


def parse_reply(content: str) -> tuple[Rewrite | None, str]:
    """The last JSON object in the reply as a Rewrite, or (None, reason). Never evaluates the text."""
    decoder = json.JSONDecoder()
    found = None
    for match in re.finditer(r"\{", content):
        try:
            value, _ = decoder.raw_decode(content, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and "answer" in value:
            found = value
    if found is None:
        return None, "llm_malformed_json"
    try:
        answer = found["answer"]
        if isinstance(answer, str) and re.fullmatch(r"-?\d+", answer.strip()):
            answer = int(answer)
        if isinstance(answer, bool) or not isinstance(answer, int):
            return None, "llm_answer_not_integer"
        params = found.get("params") or {}
        if not isinstance(params, dict):
            return None, "llm_params_not_object"
        problem = str(found.get("problem", "")).strip()
        if not problem:
            return None, "llm_empty_problem"
        return Rewrite(
            problem, answer, str(found.get("form", "")), params, str(found.get("target", "")), "llm"
        ), "ok"
    except (KeyError, TypeError, ValueError):
        return None, "llm_malformed_json"


class RequestCache:
    """Append-only jsonl of {key, content}; a torn last line (crash mid-write) is ignored on load."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.entries: dict[str, str] = {}
        if self.path.is_file():
            with open(self.path, encoding="utf-8") as handle:
                for line in handle:
                    try:
                        item = json.loads(line)
                        self.entries[item["key"]] = item["content"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        continue
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(request: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def get(self, key: str) -> str | None:
        return self.entries.get(key)

    def put(self, key: str, content: str) -> None:
        self.entries[key] = content
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"key": key, "content": content}, ensure_ascii=False) + "\n")
            handle.flush()


class LLMRewriter:
    """Rewrites many problems through one endpoint, concurrently, with retries and the request cache."""

    def __init__(
        self,
        base_url: str,
        model: str,
        cache_path: Path,
        api_key: str = "EMPTY",
        concurrency: int = 8,
        max_retries: int = 5,
        timeout_s: float = 600.0,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        backoff_s: float = 0.5,
    ):
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.concurrency, self.max_retries, self.timeout_s = concurrency, max_retries, timeout_s
        self.temperature, self.max_tokens, self.backoff_s = temperature, max_tokens, backoff_s
        self.cache = RequestCache(cache_path)
        self.stats = {"requests": 0, "cache_hits": 0, "retries": 0, "failed": 0, "seconds": 0.0}

    @classmethod
    def from_config(cls, config: BuildConfig, cache_path: Path) -> LLMRewriter:
        return cls(
            config.base_url,
            config.model,
            cache_path,
            config.api_key,
            config.concurrency,
            config.max_retries,
            config.request_timeout_s,
            config.temperature,
            config.max_tokens,
        )

    def request_for(self, problem: str, answer: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": build_messages(problem, answer),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def rewrite_many(self, items: list[tuple[str, str]]) -> list[tuple[Rewrite | None, str]]:
        """[(rewrite or None, reason)] in the order of `items` ((problem, original answer) pairs)."""
        start = time.perf_counter()
        contents = asyncio.run(self._complete_all([self.request_for(p, a) for p, a in items]))
        self.stats["seconds"] = round(self.stats["seconds"] + time.perf_counter() - start, 3)
        return [
            parse_reply(c) if c is not None else (None, f"llm_request_failed: {err}") for c, err in contents
        ]

    async def _complete_all(self, requests: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
        import openai

        client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=self.timeout_s
        )
        semaphore = asyncio.Semaphore(self.concurrency)
        bar = tqdm(total=len(requests), desc="llm rewrite", unit="problem")

        async def one(request: dict[str, Any]) -> tuple[str | None, str]:
            key = self.cache.key(request)
            cached = self.cache.get(key)
            if cached is not None:
                self.stats["cache_hits"] += 1
                bar.update(1)
                return cached, ""
            async with semaphore:
                result = await self._complete(client, request)
            if result[0] is not None:
                self.cache.put(key, result[0])
            else:
                self.stats["failed"] += 1
            bar.update(1)
            bar.set_postfix(failed=self.stats["failed"], retries=self.stats["retries"], refresh=False)
            return result

        try:
            return await asyncio.gather(*(one(r) for r in requests))
        finally:
            bar.close()
            await client.close()

    async def _complete(self, client, request: dict[str, Any]) -> tuple[str | None, str]:
        import openai

        error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                # exponential backoff with full jitter, so many workers hitting a 429 do not retry in lockstep
                await asyncio.sleep(random.uniform(0, self.backoff_s * 2 ** (attempt - 1)))
            self.stats["requests"] += 1
            try:
                response = await client.chat.completions.create(**request)
                content = response.choices[0].message.content
                if content is None:
                    error = "empty_choice"
                    continue
                return content, ""
            except openai.APIStatusError as status_error:
                error = f"http_{status_error.status_code} ({status_error.message})"
                if status_error.status_code not in RETRYABLE_STATUS:
                    return None, error
            except (openai.APITimeoutError, openai.APIConnectionError) as connection_error:
                cause = connection_error.__cause__
                error = f"{type(connection_error).__name__}" + (f" ({cause})" if cause else "")
            except (
                openai.APIResponseValidationError,
                json.JSONDecodeError,
                ValueError,
                AttributeError,
                IndexError,
                TypeError,
            ) as bad_response:
                error = f"bad_response: {type(bad_response).__name__}"
        return None, error
