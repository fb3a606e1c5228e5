"""Continuous batching (dapo_suite/inference/batching.py) on the embedded model: a request that joins a
running batch gets the tokens it gets alone; a batch that never drains does not widen; rows with different
settings share a batch; a cancelled row stops; the shared-prefix prompt pass gives the plain one's cache; and
the server's text streaming (multi-byte characters, stop strings)."""

from __future__ import annotations

import threading

import pytest
import torch

from dapo_suite.core.prompts import format_prompt, render_chat

QUESTIONS = ["What is 2 + 3?", "A baker has 12 loaves and sells 5. How many are left?", "What is 9 times 4?"]


@pytest.fixture(scope="module")
def model_and_tokenizer(embedded_model_dir):
    from dapo_suite.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir), dtype="float32")
    model.eval()
    return model, tokenizer


def _prompt_ids(tokenizer) -> list[list[int]]:
    return [
        tokenizer(render_chat(tokenizer, format_prompt(q)), add_special_tokens=False).input_ids
        for q in QUESTIONS
    ]


def _decode(model, tokenizer, specs: list[dict], pause: float = 0.0) -> list[tuple[list[int], str]]:
    """Run jobs (GenerationJob keyword arguments) through a fresh BatchDecoder; (tokens, finish) of each. With
    `pause`, each job is submitted that long after the one before, so it joins the running batch."""
    import time

    from dapo_suite.inference.batching import BatchDecoder, GenerationJob
    from dapo_suite.inference.engines import end_of_response_ids

    decoder = BatchDecoder(model, end_of_response_ids(model, tokenizer), tokenizer.pad_token_id, join_every=2)
    results: list[tuple[list[int], str]] = [([], "") for _ in specs]
    finished = threading.Semaphore(0)
    jobs = []

    def emitter(index: int):
        def emit(event) -> None:
            kind, value = event
            if kind == "token":
                results[index][0].append(value)
            else:
                results[index] = (results[index][0], str(value))
                finished.release()

        return emit

    for index, spec in enumerate(specs):
        jobs.append(GenerationJob(emit=emitter(index), **spec))
        decoder.submit(jobs[-1])
        time.sleep(pause)
    for _ in specs:
        assert finished.acquire(timeout=900), "a job never ended"
    return results


def test_a_request_that_joins_a_running_batch_gets_the_tokens_it_gets_alone(model_and_tokenizer):
    """The second job joins by rebuilding the cache buffer (with spare rows), the third is written into it in
    place; each gets the tokens it gets alone."""
    model, tokenizer = model_and_tokenizer
    ids = _prompt_ids(tokenizer)
    specs = [
        {"prompt_ids": ids[i], "max_tokens": 48, "temperature": 1.0, "top_p": 0.7, "seed": 11 + i}
        for i in range(3)
    ]
    alone = [_decode(model, tokenizer, [spec])[0] for spec in specs]
    joined = _decode(model, tokenizer, specs, pause=1.0)
    assert joined == alone
    assert len({tuple(tokens) for tokens, _ in alone}) == 3


def test_a_batch_that_never_drains_stays_as_wide_as_its_oldest_row(model_and_tokenizer):
    """A relay, as a busy endpoint runs: a row joins every 12 steps and lives 24, so the batch never empties.
    After 300 steps the cache is no wider than a row's prompt and life plus a rebuild's spare slots (it
    widened by a slot a step while rebuilds kept the slots no row reads), and the last rows get the greedy
    tokens they get alone."""
    from dapo_suite.inference.decoding import JOIN_HEADROOM_SLOTS, make_stepper

    model, tokenizer = model_and_tokenizer
    prompts = [torch.tensor([ids]) for ids in _prompt_ids(tokenizer)]
    life, every, steps = 24, 12, 300

    def start(prompt: torch.Tensor):
        return prompt, torch.ones_like(prompt), torch.tensor([prompt.shape[1] - 1]), prompt[:, -1]

    def alone(prompt: torch.Tensor) -> list[int]:
        ids, mask, positions, tokens = start(prompt)
        stepper, out = make_stepper(model, ids, mask, life), []
        for _ in range(life):
            tokens = stepper.step(tokens, positions).argmax(-1)
            positions = positions + 1
            out.append(tokens.item())
        return out

    with torch.inference_mode():
        ids, mask, positions, tokens = start(prompts[0])
        stepper = make_stepper(model, ids, mask, life)
        live, joined, finished = (
            [[]],
            [0],
            [],
        )  # tokens of each live row, which prompt it is; (prompt, tokens)
        for step in range(steps):
            tokens = stepper.step(tokens, positions).argmax(-1)
            positions = positions + 1
            for row, token in enumerate(tokens.tolist()):
                live[row].append(token)
            keep = [row for row, out in enumerate(live) if len(out) < life]
            finished += [(joined[row], live[row]) for row, out in enumerate(live) if len(out) == life]
            if len(keep) < len(live):
                index = torch.tensor(keep)
                stepper.select(index)
                positions, tokens = positions[index], tokens[index]
                live, joined = [live[row] for row in keep], [joined[row] for row in keep]
            if step % every == every - 1:
                prompt = (step // every + 1) % len(prompts)
                ids, mask, prompt_positions, prompt_tokens = start(prompts[prompt])
                stepper.add_rows(model, ids, mask, life)
                positions, tokens = (
                    torch.cat([positions, prompt_positions]),
                    torch.cat([tokens, prompt_tokens]),
                )
                live, joined = [*live, []], [*joined, prompt]
    assert len(finished) >= steps // every - 2
    widest_prompt = max(prompt.shape[1] for prompt in prompts)
    assert stepper.kv.shape[4] <= widest_prompt + 2 * life + JOIN_HEADROOM_SLOTS < widest_prompt + steps
    for prompt, out in finished[-len(prompts) :]:
        assert out == alone(prompts[prompt])


def test_rows_with_different_settings_share_a_batch(model_and_tokenizer):
    """A greedy row, a hot row and a short row decoded together: each as alone; the short row ends by
    length."""
    model, tokenizer = model_and_tokenizer
    ids = _prompt_ids(tokenizer)
    specs = [
        {"prompt_ids": ids[0], "max_tokens": 24, "temperature": 0.0},
        {"prompt_ids": ids[1], "max_tokens": 24, "temperature": 1.5, "top_p": 1.0, "seed": 3},
        {"prompt_ids": ids[2], "max_tokens": 5, "temperature": 1.0, "top_p": 0.7, "seed": 4},
    ]
    together = _decode(model, tokenizer, specs)
    assert together == [_decode(model, tokenizer, [spec])[0] for spec in specs]
    assert together[2] == (together[2][0], "length") and len(together[2][0]) == 5


def test_log_probs_only_for_the_rows_that_ask_and_the_same_tokens(model_and_tokenizer):
    """A row with top_logprobs and one without, in one batch: each samples the tokens it samples with no
    log-probs asked; the asking row gets one entry per token (its log-prob and 4 alternatives, most likely
    first), the other none. The prompt's log-probs (echo) are the model's own, under the row's temperature."""
    from dapo_suite.inference.batching import BatchDecoder, GenerationJob
    from dapo_suite.inference.engines import end_of_response_ids

    model, tokenizer = model_and_tokenizer
    ids = _prompt_ids(tokenizer)
    specs = [
        {"prompt_ids": ids[0], "max_tokens": 10, "temperature": 0.8, "seed": 5},
        {"prompt_ids": ids[1], "max_tokens": 10, "temperature": 1.0, "top_p": 0.7, "seed": 6},
    ]
    plain = _decode(model, tokenizer, specs)
    decoder = BatchDecoder(model, end_of_response_ids(model, tokenizer), tokenizer.pad_token_id)
    done = threading.Semaphore(0)
    tokens: list[list[int]] = [[], []]
    jobs = [
        GenerationJob(
            **spec,
            top_logprobs=top,
            emit=lambda event, row=row: (
                tokens[row].append(event[1]) if event[0] == "token" else done.release()
            ),
        )
        for row, (spec, top) in enumerate(zip(specs, (4, None), strict=True))
    ]
    decoder.submit(*jobs)
    assert done.acquire(timeout=900) and done.acquire(timeout=900)
    assert tokens == [plain[0][0], plain[1][0]]
    assert len(jobs[0].logprobs) == len(tokens[0]) and jobs[1].logprobs == []
    for token, (log_prob, alternatives) in zip(tokens[0], jobs[0].logprobs, strict=True):
        values = [value for _, value in alternatives]
        assert (
            len(alternatives) == 4 and values == sorted(values, reverse=True) and log_prob <= values[0] + 1e-6
        )
        assert token not in dict(alternatives) or abs(dict(alternatives)[token] - log_prob) < 1e-6
    scored = decoder.score_prompt(ids[2], 0.0, 2)
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([ids[2]])).logits[0, :-1].float(), -1)
    assert len(scored) == len(ids[2]) - 1
    assert (
        max(abs(log_prob - expected[i, ids[2][i + 1]].item()) for i, (log_prob, _) in enumerate(scored))
        < 1e-5
    )


def test_a_cancelled_row_stops_at_the_next_step(model_and_tokenizer):
    from dapo_suite.inference.batching import BatchDecoder, GenerationJob
    from dapo_suite.inference.engines import end_of_response_ids

    model, tokenizer = model_and_tokenizer
    decoder = BatchDecoder(model, end_of_response_ids(model, tokenizer), tokenizer.pad_token_id)
    seen, ended = [], threading.Event()

    def emit(event) -> None:
        seen.append(event)
        if event[0] == "token" and len(seen) == 3:
            job.cancelled = True
        if event[0] != "token":
            ended.set()

    job = GenerationJob(_prompt_ids(tokenizer)[1], max_tokens=500, temperature=0.0, emit=emit)
    decoder.submit(job)
    assert ended.wait(900)
    assert seen[-1] == ("end", "cancelled") and len(seen) <= 5


@pytest.mark.parametrize("prompt_pass", ["torch ops", "fused kernels"])
def test_a_cached_common_beginning_gives_the_plain_prompt_passs_decoding(
    model_and_tokenizer, monkeypatch, prompt_pass
):
    """Prompts that begin alike (the chat template and the DAPO instruction): their common beginning runs
    once, and a later call finds it in the cache (here a single prompt, which has nothing to share within its
    own call). The decode steps' logits equal the plain pass's within float32 rounding, and the greedy tokens
    are the same. Both prompt passes take the cache: transformers' forward (the stepper on torch's ops: no C++
    compiler, a GPU) and the fused kernels' packed pass, whose tokens through the model are counted: fewer by
    the shared beginning."""
    import dapo_suite.inference.weights as weights
    from dapo_suite.inference.decoding import LeanStepper, make_stepper
    from dapo_suite.inference.prefill import PrefixCache

    if prompt_pass == "torch ops":
        monkeypatch.setattr(weights, "kernels", lambda: None)
    elif weights.kernels() is None:
        pytest.skip("the fused kernels did not build here (no C++ compiler)")
    ran: list[int] = []  # tokens per call of the fused layer loop
    fused_layers = LeanStepper._fused_layers
    monkeypatch.setattr(
        LeanStepper,
        "_fused_layers",
        lambda self, tokens, *rest: ran.append(tokens.shape[0]) or fused_layers(self, tokens, *rest),
    )
    model, tokenizer = model_and_tokenizer
    tokenizer.padding_side = "left"

    def greedy(questions: list[str], cache: PrefixCache | None) -> tuple[torch.Tensor, torch.Tensor, int]:
        texts = [render_chat(tokenizer, format_prompt(q)) for q in questions]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        ran.clear()
        with torch.inference_mode():
            stepper = make_stepper(model, encoded.input_ids, encoded.attention_mask, 16, prefix_cache=cache)
            prompt_tokens = sum(ran)
            positions, tokens = encoded.attention_mask.sum(-1) - 1, encoded.input_ids[:, -1]
            out, logits = [], []
            for _ in range(16):
                step = stepper.step(tokens, positions)
                tokens, positions = step.argmax(-1), positions + 1
                out.append(tokens)
                logits.append(step)
        return torch.stack(out, 1), torch.stack(logits, 1), prompt_tokens

    cache = PrefixCache()
    for questions in (QUESTIONS, ["What is 7 + 8?"]):
        plain, cached = greedy(questions, None), greedy(questions, cache)
        assert torch.equal(plain[0], cached[0])
        torch.testing.assert_close(cached[1], plain[1], atol=1e-3, rtol=1e-4)
        if prompt_pass == "fused kernels":  # the beginning once in the first call, not at all in the second
            shared = 40 * (len(questions) - 1) if len(questions) > 1 else 40
            assert cached[2] <= plain[2] - shared, (cached[2], plain[2])
    assert (
        cache.match(
            [
                torch.tensor(
                    tokenizer(
                        render_chat(tokenizer, format_prompt("What is 1 + 1?")), add_special_tokens=False
                    ).input_ids
                )
            ]
        )[0]
        >= 40
    )


def test_text_streams_in_whole_characters_and_stops_before_a_stop_string(model_and_tokenizer):
    from dapo_suite.inference.sampler_server import IncrementalText, StopStrings

    _, tokenizer = model_and_tokenizer
    text = "Prix: 12 € — voilà 你好 done"
    stream = IncrementalText(tokenizer)
    pieces = [stream.push(token) for token in tokenizer(text, add_special_tokens=False).input_ids]
    assert "".join(pieces) == text and not any("\ufffd" in piece for piece in pieces)

    stops = StopStrings(["Answer:", "\n\n"])
    released = [stops.feed(piece) for piece in ["The sum is 5. Ans", "wer", ": 5"]]
    assert released == [("The sum is 5. ", False), ("", False), ("", True)]
    stops = StopStrings(["Answer:"])
    assert stops.feed("An") == ("", False) and stops.feed("d so") == ("And so", False) and stops.flush() == ""


def test_a_one_token_prompt_is_decoded(model_and_tokenizer):
    """A prompt of one token has nothing to cache before the token the first step feeds (a bare
    completion)."""
    model, tokenizer = model_and_tokenizer
    ids = tokenizer("Hello", add_special_tokens=False).input_ids
    assert len(ids) == 1
    ((tokens, finish),) = _decode(
        model, tokenizer, [{"prompt_ids": ids, "max_tokens": 4, "temperature": 0.0}]
    )
    assert len(tokens) == 4 and finish == "length"
