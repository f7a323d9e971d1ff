"""Cache-aware routing across replicas (chapter 11), simulated.

``num_replicas`` replicas each run chapter 4's scheduler over their own KV budget, whose prefix
cache is a radix tree (:class:`~kvlib.paged.radix_cache.RadixBlockManager`, blocks of 16), and each
replica's steps are timed by a step model: by default the book's A100 OPT-13B roofline
(:func:`kvlib.serving.roofline.roofline_step_model`, chapter 4), every replica an A100 with chapter
4's budget. A router sends each arriving turn to one replica:

- ``round-robin``: the next replica in turn;
- ``least-loaded``: the replica with the fewest requests it sent that have not finished;
- ``prefix-aware``: SGLang's cache-aware router (sgl-router's ``cache_aware`` policy). The router
  keeps its own radix tree per replica, of the prompts it sent there (it does not see the replica's
  evictions; its tree is bounded to the replica's slots). If the loads are imbalanced, both
  ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold x min``, it sends the turn
  to the least-loaded replica. Otherwise it sends it to the replica whose tree matches the largest
  share of the prompt if that share exceeds ``cache_threshold``, and else to the replica with the
  smallest tree (the most room). sgl-router's defaults: 0.5, 32 and 1.0001.

Turns are closed-loop: a conversation's next turn arrives :data:`THINK_S` after its answer finished.
The generated tokens are the trace's answers, so that a replica's cache holds what the next turn
sends. A replica's load is read at the end of its last simulated step.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from kvlib import KVLibError
from kvlib.chapters.ch11_radix_routing.traces import Turn, conversations
from kvlib.checks import require_int, require_real
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.radix_cache import RadixBlockManager
from kvlib.paged.radix_tree import RadixTree
from kvlib.serving.placement import PagedMemory
from kvlib.serving.scheduler import Scheduler
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import Request

ROUTING_POLICIES = ("round-robin", "least-loaded", "prefix-aware")
NUM_REPLICAS = 4
ROUTED_CONVERSATIONS = 192
ROUTED_TURNS = 4
ONE_REPLICA_CONVERSATIONS = 48  # one replica alone: a quarter of the routing trace's conversations
THINK_S = 0.5  # seconds between an answer and the conversation's next message
START_S = 2.0  # conversations start at seeded uniform times in [0, START_S)
REPLICA_BLOCK_SIZE = 16
MAX_LEN = 1024  # the longest turn a replica admits (the trace's are shorter)
CACHE_THRESHOLD = 0.5  # sgl-router's defaults
BALANCE_ABS_THRESHOLD = 32
BALANCE_REL_THRESHOLD = 1.0001


@dataclass(frozen=True)
class RouterConfig:
    """The prefix-aware router's thresholds (see the module's docstring)."""

    cache_threshold: float = CACHE_THRESHOLD
    balance_abs_threshold: int = BALANCE_ABS_THRESHOLD
    balance_rel_threshold: float = BALANCE_REL_THRESHOLD


class Router:
    """Chooses a replica for each turn under one of :data:`ROUTING_POLICIES`."""

    def __init__(
        self, policy: str, num_replicas: int, tree_tokens: int, config: RouterConfig = RouterConfig()
    ):
        if policy not in ROUTING_POLICIES:
            raise KVLibError(f"policy must be one of {', '.join(ROUTING_POLICIES)}, not {policy!r}")
        self.policy, self.config = policy, config
        self.num_replicas = require_int(num_replicas, "num_replicas")
        self.tree_tokens = require_int(tree_tokens, "tree_tokens")
        self.trees = [RadixTree() for _ in range(self.num_replicas)]  # the router's view, token pages
        self.loads = [0] * self.num_replicas  # requests sent and not finished
        self._next = 0
        self.num_balanced = 0  # prefix-aware turns sent by the load rule
        self.num_cache_routed = 0  # prefix-aware turns sent to the best match

    def _least_loaded(self) -> int:
        return int(np.argmin(self.loads))

    def route(self, prompt: tuple[int, ...]) -> int:
        """The replica for a turn with this prompt; its load grows by one."""
        if self.policy == "round-robin":
            choice, self._next = self._next, (self._next + 1) % self.num_replicas
        elif self.policy == "least-loaded":
            choice = self._least_loaded()
        else:
            choice = self._prefix_aware(prompt)
            tree = self.trees[choice]
            tree.insert(prompt)
            if tree.num_tokens > self.tree_tokens:
                tree.evict(tree.num_tokens - self.tree_tokens)
        self.loads[choice] += 1
        return choice

    def _prefix_aware(self, prompt: tuple[int, ...]) -> int:
        high, low, config = max(self.loads), min(self.loads), self.config
        if high - low > config.balance_abs_threshold and high > config.balance_rel_threshold * low:
            self.num_balanced += 1
            return self._least_loaded()
        matched = [tree.match_prefix(prompt).num_tokens for tree in self.trees]
        best = int(np.argmax(matched))
        if matched[best] / len(prompt) > config.cache_threshold:
            self.num_cache_routed += 1
            return best
        return int(np.argmin([tree.num_tokens for tree in self.trees]))

    def finished(self, replica: int) -> None:
        """A request sent to ``replica`` finished."""
        self.loads[replica] -= 1


REPLICA_CACHES = ("radix", "hash", "none")  # a replica's prefix cache: the tree, chapter 3's hashes, none


class CountingMemory(PagedMemory):
    """Chapter 4's paged memory, counting the prompt tokens it admits and those its prefix cache held."""

    def __init__(self, manager, max_len: int):
        super().__init__(manager, max_len)
        self.num_lookup_tokens = 0
        self.num_hit_tokens = 0

    def admit(self, seq):
        """:meth:`PagedMemory.admit`, counted."""
        cached = super().admit(seq)
        if cached is not None:
            self.num_lookup_tokens += len(seq.tokens)
            self.num_hit_tokens += cached
        return cached


class Replica:
    """One server: chapter 4's scheduler over a paged memory with one of :data:`REPLICA_CACHES`, its clock."""

    def __init__(self, num_slots: int, cache: str = "radix"):
        num_blocks = num_slots // REPLICA_BLOCK_SIZE
        if cache == "radix":
            self.manager = RadixBlockManager(num_blocks, REPLICA_BLOCK_SIZE)
        elif cache in REPLICA_CACHES:
            self.manager = BlockManager(num_blocks, REPLICA_BLOCK_SIZE, enable_prefix_caching=cache == "hash")
        else:
            raise KVLibError(f"cache must be one of {', '.join(REPLICA_CACHES)}, not {cache!r}")
        self.memory = CountingMemory(self.manager, MAX_LEN)
        self.scheduler = Scheduler(self.memory, [])
        self.now = 0.0

    def idle(self) -> bool:
        """No turn pending, waiting or running."""
        return not self.scheduler.has_work()


@dataclass(frozen=True)
class RoutingRun:
    """One policy's simulated run (all times simulated seconds)."""

    policy: str
    hit_rate: float  # prompt tokens the replicas' trees held, over all prompt tokens allocated
    ttft_s: np.ndarray  # (turns,) time to first token of each turn
    tokens_per_s: float  # output tokens over the makespan
    turns_per_replica: tuple[int, ...]
    num_preemptions: int
    num_balanced: int  # prefix-aware: turns the load rule sent

    @property
    def p99_ttft_s(self) -> float:
        """The 99th percentile of the turns' TTFT."""
        return float(np.percentile(self.ttft_s, 99))

    @property
    def mean_ttft_s(self) -> float:
        """The turns' mean TTFT."""
        return float(np.mean(self.ttft_s))


def default_step_model_and_slots() -> tuple[StepTimeModel, int]:
    """The A100 OPT-13B roofline step model and chapter 4's budget per replica."""
    from kvlib.chapters.ch08_serving_engines.prefix_prediction import step_model_and_budget

    return step_model_and_budget(None, None)


def simulate_routing(
    policy: str,
    convs: list[list[Turn]] | None = None,
    num_replicas: int = NUM_REPLICAS,
    config: RouterConfig = RouterConfig(),
    step_model: StepTimeModel | None = None,
    num_slots: int | None = None,
    seed: int = 0,
    cache: str = "radix",
) -> RoutingRun:
    """Serve the conversations' turns on ``num_replicas`` replicas routed by ``policy`` (simulated),
    each replica's prefix cache one of :data:`REPLICA_CACHES`."""
    if step_model is None or num_slots is None:
        default_model, default_slots = default_step_model_and_slots()
        step_model = default_model if step_model is None else step_model
        num_slots = default_slots if num_slots is None else require_int(num_slots, "num_slots")
    convs = conversations(ROUTED_CONVERSATIONS, ROUTED_TURNS, seed) if convs is None else convs
    replicas = [Replica(num_slots, cache) for _ in range(require_int(num_replicas, "num_replicas"))]
    router = Router(policy, num_replicas, num_slots, config)
    starts = np.random.default_rng([seed, 14]).uniform(0, require_real(START_S, "START_S"), len(convs))
    arrivals = [(float(t), c, 0) for c, t in enumerate(starts)]  # (time, conversation, turn)
    heapq.heapify(arrivals)
    answers, where, first_arrival, ttft, last = {}, {}, float(starts.min()), [], 0.0
    while True:
        busy = [r for r in replicas if not r.idle()]
        step_at = min((r.now for r in busy), default=np.inf)
        if arrivals and arrivals[0][0] <= step_at:
            at, c, k = heapq.heappop(arrivals)
            turn = convs[c][k]
            req_id = len(answers)
            answers[req_id], index = turn.answer, router.route(turn.prompt)
            where[req_id] = (index, c, k)
            replica = replicas[index]
            if replica.idle():
                replica.now = max(replica.now, at)
            replica.scheduler.pending.append(Request(req_id, at, turn.prompt, len(turn.answer)))
            continue
        if not busy:
            break
        replica = min(busy, key=lambda r: r.now)
        scheduler = replica.scheduler
        plan = scheduler.schedule(replica.now)
        if plan.num_seqs == 0:
            raise KVLibError(f"a replica of {num_slots} slots cannot run its first waiting turn")
        duration = step_model.step_s(plan)
        replica.now += duration
        scheduler.memory.mark_computed(plan)
        num_done = len(scheduler.finished)
        scheduler.complete(plan, [answers[s.seq_id][s.num_generated] for s in plan.seqs], replica.now)
        for seq in scheduler.finished[num_done:]:
            index, c, k = where[seq.seq_id]
            router.finished(index)
            ttft.append(seq.first_token_s - seq.request.arrival_s)
            last = max(last, seq.finish_s)
            if k + 1 < len(convs[c]):
                heapq.heappush(arrivals, (seq.finish_s + THINK_S, c, k + 1))
    hits = sum(r.memory.num_hit_tokens for r in replicas)
    lookups = sum(r.memory.num_lookup_tokens for r in replicas)
    return RoutingRun(
        policy,
        hits / lookups,
        np.array(ttft),
        sum(len(a) for a in answers.values()) / (last - first_arrival),
        tuple(sum(1 for index, _, _ in where.values() if index == i) for i in range(len(replicas))),
        sum(r.scheduler.num_preemptions for r in replicas),
        router.num_balanced,
    )


THRESHOLDS = (0, 4, 8, 16, 32, 64, None)  # balance_abs_threshold swept; None: the load rule never fires


def routing_rows(seed: int = 0, thresholds=THRESHOLDS) -> list[dict]:
    """One row per policy: round-robin, least-loaded, then prefix-aware at each ``balance_abs_threshold``
    (sgl-router's other thresholds), with each run's hit rate, TTFT, throughput and turns per replica."""
    convs = conversations(ROUTED_CONVERSATIONS, ROUTED_TURNS, seed)
    runs = [(policy, None, simulate_routing(policy, convs, seed=seed)) for policy in ROUTING_POLICIES[:2]]
    for threshold in thresholds:
        config = RouterConfig(balance_abs_threshold=NEVER if threshold is None else threshold)
        runs.append(
            ("prefix-aware", threshold, simulate_routing("prefix-aware", convs, config=config, seed=seed))
        )
    return [
        {
            "policy": policy,
            "balance_abs_threshold": "never" if policy == "prefix-aware" and threshold is None else threshold,
            "hit rate": run.hit_rate,
            "p99 TTFT (s)": run.p99_ttft_s,
            "mean TTFT (s)": run.mean_ttft_s,
            "tokens/s": run.tokens_per_s,
            "most turns on a replica": max(run.turns_per_replica),
            "fewest turns on a replica": min(run.turns_per_replica),
            "sent by the load rule": run.num_balanced,
            "preemptions": run.num_preemptions,
        }
        for policy, threshold, run in runs
    ]


NEVER = 1 << 30  # a balance_abs_threshold no load difference reaches


def one_replica_rows(seed: int = 0, num_conversations: int = ONE_REPLICA_CONVERSATIONS) -> list[dict]:
    """One replica serving ``num_conversations`` conversations (the routing trace's kind), its prefix
    cache each of :data:`REPLICA_CACHES`: hit rate, throughput and TTFT (simulated)."""
    convs = conversations(num_conversations, ROUTED_TURNS, seed)
    rows = []
    for cache in REPLICA_CACHES:
        run = simulate_routing("round-robin", convs, num_replicas=1, seed=seed, cache=cache)
        rows.append(
            {
                "prefix cache": cache,
                "hit rate": run.hit_rate,
                "tokens/s": run.tokens_per_s,
                "p99 TTFT (s)": run.p99_ttft_s,
                "mean TTFT (s)": run.mean_ttft_s,
                "preemptions": run.num_preemptions,
            }
        )
    return rows
