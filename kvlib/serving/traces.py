"""Seeded request traces for the serving experiments of chapter 4.

The vLLM paper (Kwon et al. 2023) serves two request traces: ShareGPT conversations (mean
prompt 161.31 tokens, mean output 337.99) and Alpaca instructions (19.31 and 58.45), with
at most 2,048 tokens per request. We do not ship either data set. Instead we draw lengths
from log-normal distributions, a common model for text lengths: most requests are short,
a few are very long. Each distribution has a stated spread ``sigma`` (the standard
deviation of the log length) and a location ``mu`` solved so that the means *after*
clipping to the maximum length match the paper's:

- a prompt takes ``round(clip(X, 1, max_len - 1))`` tokens, ``X ~ LogNormal(mu_in, sigma)``;
- its output takes ``round(clip(Y, 1, max_len - prompt))``, ``Y ~ LogNormal(mu_out, sigma)``.

Requests arrive as a Poisson process: independent exponential gaps of mean ``1 / rate``.
A rate of ``inf`` puts every request in the queue at time 0 (a saturated server).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from kvlib import KVLibError
from kvlib.checks import are_token_ids, require_int, require_real

MAX_REQUESTS = 10**6  # requests of one trace: each is a Python object, and a simulation steps through all


@dataclass(frozen=True)
class TraceSpec:
    """Length distribution of a trace: target means after clipping, spread, maximum length."""

    name: str
    mean_input: float  # mean prompt length after clipping (tokens)
    mean_output: float  # mean output length after clipping (tokens)
    sigma: float = 1.0  # standard deviation of log(length), for prompts and outputs alike
    max_len: int = 2048  # prompt + output
    source: str = ""

    def __post_init__(self):
        for key in ("mean_input", "mean_output", "sigma"):
            require_real(getattr(self, key), f"trace {self.name!r}: {key}")
        require_int(self.max_len, f"trace {self.name!r}: max_len", 2)
        if not (self.sigma > 0 and self.max_len >= 2):
            raise KVLibError(
                f"trace {self.name!r}: sigma must be > 0 and max_len >= 2, not {self.sigma}, {self.max_len}"
            )
        if (
            not 1 <= self.mean_input < self.max_len - 1
            or not 1 <= self.mean_output < self.max_len - self.mean_input
        ):
            raise KVLibError(
                f"trace {self.name!r}: means {self.mean_input}, {self.mean_output} "
                f"do not fit in max_len {self.max_len}"
            )

    @cached_property
    def mu_input(self) -> float:
        """Location of the prompts' log-normal, solved so that the clipped mean is ``mean_input``."""
        return _solve_mu(
            lambda mu: clipped_lognormal_mean(mu, self.sigma, 1, self.max_len - 1), self.mean_input
        )

    @cached_property
    def mu_output(self) -> float:
        """Location of the outputs' log-normal: the clipped mean, averaged over the prompt lengths
        (each output is clipped to what its prompt leaves), is ``mean_output``."""
        inputs = self._input_quantiles()

        def mean(mu: float) -> float:
            return float(
                np.mean([clipped_lognormal_mean(mu, self.sigma, 1, self.max_len - x) for x in inputs])
            )

        return _solve_mu(mean, self.mean_output)

    def _input_quantiles(self, num: int = 256) -> np.ndarray:
        """Prompt lengths at evenly spaced quantiles: the expectation over prompts as a plain average."""
        probs = (np.arange(num) + 0.5) / num
        z = np.array([_normal_quantile(p) for p in probs])
        return np.clip(np.round(np.exp(self.mu_input + self.sigma * z)), 1, self.max_len - 1)

    def scaled(self, factor: float, name: str | None = None) -> TraceSpec:
        """The same shapes with every length divided by ``factor`` (for runs of the real model)."""
        require_real(factor, "the scaling factor", positive=True)
        return replace(
            self,
            name=name or f"{self.name} / {factor:g}",
            mean_input=self.mean_input / factor,
            mean_output=self.mean_output / factor,
            max_len=int(round(self.max_len / factor)),
        )


SHAREGPT = TraceSpec("ShareGPT-like", 161.31, 337.99, source="vLLM paper, ShareGPT trace")

ALPACA = TraceSpec("Alpaca-like", 19.31, 58.45, source="vLLM paper, Alpaca trace")


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _normal_quantile(p: float) -> float:
    low, high = -12.0, 12.0
    for _ in range(80):
        mid = (low + high) / 2
        low, high = (mid, high) if _normal_cdf(mid) < p else (low, mid)
    return (low + high) / 2


def clipped_lognormal_mean(mu: float, sigma: float, low: float, high: float) -> float:
    """E[min(max(X, low), high)] for X ~ LogNormal(mu, sigma), in closed form.

    Below ``low`` counts as ``low``, above ``high`` as ``high``, and in between the partial
    mean of a log-normal: exp(mu + sigma^2 / 2) (Phi(b - sigma) - Phi(a - sigma)).
    ``sigma`` must be > 0 and ``0 < low <= high``, all finite (else a one-line KVLibError).
    """
    for name, value in (("mu", mu), ("sigma", sigma), ("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise KVLibError(f"{name} must be a finite number, not {value!r}"[:200])
    if not sigma > 0 or not 0 < low <= high:
        raise KVLibError(
            f"sigma must be > 0 and 0 < low <= high, not sigma {sigma!r}, low {low!r}, high {high!r}"
        )
    a, b = (math.log(low) - mu) / sigma, (math.log(high) - mu) / sigma
    inside = math.exp(mu + sigma**2 / 2) * (_normal_cdf(b - sigma) - _normal_cdf(a - sigma))
    return low * _normal_cdf(a) + inside + high * (1 - _normal_cdf(b))


def _solve_mu(mean_of_mu, target: float) -> float:
    """Bisection: the clipped mean grows with mu."""
    low, high = -10.0, 15.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if mean_of_mu(mid) < target else (low, mid)
    return (low + high) / 2


def sample_lengths(spec: TraceSpec, num: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of ``num`` requests, (num,) each, every total at most ``max_len``."""
    if not isinstance(spec, TraceSpec):
        raise KVLibError(f"spec must be a TraceSpec (see TRACE_SPECS), not {type(spec).__name__}")
    if isinstance(num, bool) or not isinstance(num, numbers.Integral) or not 1 <= num <= MAX_REQUESTS:
        raise KVLibError(f"the number of requests must be an integer from 1 to {MAX_REQUESTS:,}, not {num!r}")
    num = int(num)
    rng = np.random.default_rng(require_int(seed, "the seed", 0))
    inputs = np.clip(np.round(rng.lognormal(spec.mu_input, spec.sigma, num)), 1, spec.max_len - 1).astype(int)
    outputs = np.round(rng.lognormal(spec.mu_output, spec.sigma, num))
    outputs = np.clip(outputs, 1, spec.max_len - inputs).astype(int)
    return inputs, outputs


@dataclass(frozen=True)
class Request:
    """One request of a trace: when it arrives, its prompt's token ids, and how many tokens it generates.

    The output length is known to the trace (and to the ``oracle`` and ``pow2`` policies,
    which the paper also grants this knowledge), not to the ``max`` and ``paged`` policies.
    """

    req_id: int  # its position in the trace, and its sequence id in the server
    arrival_s: float  # seconds after the trace starts
    prompt: tuple[int, ...] = field(repr=False)  # token ids
    output_len: int  # tokens it generates

    def __post_init__(self):
        """Refuse what no server can serve, in one line naming the field.

        ``output_len`` must be at least 1, as vLLM requires ``max_tokens >= 1``
        (vllm/sampling_params.py, ``SamplingParams._verify_args``: a vLLM server answers
        ``max_tokens=0`` with "max_tokens must be at least 1, got 0."). We reject 0 rather
        than finish such a request at once, because no engine can: the prefill that computes
        a prompt's K/V also produces its first output token. The scheduler retires a request
        when it has generated ``output_len`` tokens; at 0 that never happened, so the
        simulator kept the request (and, under ``max``, ``pow2`` and ``oracle``, its
        reservation) forever and never returned. The prompt holds at least one token id
        (vLLM refuses an empty prompt too: the last prompt token's logits choose the first
        output token), and the arrival is a finite time >= 0 (a NaN arrival never arrives).
        """
        require_int(self.req_id, "req_id", 0)
        require_real(self.arrival_s, f"request {self.req_id}: arrival_s")
        if not isinstance(self.prompt, tuple | list) or not self.prompt:
            raise KVLibError(f"request {self.req_id}: the prompt must be a non-empty tuple of token ids")
        if not are_token_ids(self.prompt):
            raise KVLibError(
                f"request {self.req_id}: token ids must be integers >= 0, not {self.prompt!r}"[:200]
            )
        require_int(self.output_len, f"request {self.req_id}: output_len (vLLM's max_tokens)", 1)

    @property
    def prompt_len(self) -> int:
        """Tokens of the prompt."""
        return len(self.prompt)

    @property
    def total_len(self) -> int:
        """Prompt plus output: the slots the request fills when it finishes."""
        return len(self.prompt) + self.output_len


def make_trace(
    spec: TraceSpec,
    num_requests: int,
    rate: float,
    seed: int = 0,
    vocab_size: int = 512,
    system_prompt: tuple[int, ...] = (),
) -> list[Request]:
    """``num_requests`` requests of ``spec`` arriving at ``rate`` requests per second (Poisson;
    ``inf``: all at time 0).

    Prompt token ids are seeded random integers below ``vocab_size``. A ``system_prompt`` is
    put in front of every prompt, which makes it longer (outputs are shortened if the total
    would exceed ``max_len``).
    """
    require_real(rate, "the request rate (requests per second)", allow_inf=True, positive=True)
    require_int(vocab_size, "vocab_size")
    if not are_token_ids(system_prompt):
        raise KVLibError(f"system_prompt must be a tuple of token ids >= 0, not {system_prompt!r}"[:200])
    inputs, outputs = sample_lengths(spec, num_requests, seed)
    rng = np.random.default_rng([seed, 1])
    gaps = np.zeros(num_requests) if math.isinf(rate) else rng.exponential(1.0 / rate, num_requests)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first request arrives at time 0
    requests = []
    for i, (n_in, n_out, at) in enumerate(zip(inputs, outputs, arrivals, strict=True)):
        prompt = tuple(system_prompt) + tuple(rng.integers(0, vocab_size, int(n_in)).tolist())
        if len(prompt) >= spec.max_len:
            raise KVLibError(
                f"a system prompt of {len(system_prompt)} tokens leaves no room within max_len {spec.max_len}"
            )
        n_out = min(int(n_out), spec.max_len - len(prompt))
        requests.append(Request(i, float(at), prompt, n_out))
    return requests


def trace_stats(requests: list[Request]) -> dict:
    """Mean prompt, output and total length, and the longest total, of a list of requests."""
    if not isinstance(requests, list | tuple) or not all(isinstance(r, Request) for r in requests):
        raise KVLibError(f"requests must be a list of Request, not {type(requests).__name__}")
    if not requests:
        raise KVLibError("the trace is empty")
    inputs = np.array([r.prompt_len for r in requests])
    outputs = np.array([r.output_len for r in requests])
    return {
        "requests": len(requests),
        "mean input": float(inputs.mean()),
        "mean output": float(outputs.mean()),
        "mean total": float((inputs + outputs).mean()),
        "longest total": int((inputs + outputs).max()),
    }
