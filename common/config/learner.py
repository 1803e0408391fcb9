"""Configuration of the learner (``learner:`` section)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Annotated, Literal

from common.config.horizon import HorizonConfig
from common.config.types import (
    Bool,
    Count,
    Discriminator,
    Float,
    Ge,
    Gt,
    Le,
    Lt,
    NonNegative,
    NonNegativeInt,
    Positive,
    Share,
    Str,
    Tag,
    section,
)

Advantage = Literal["grpo", "rloo", "reinforce_pp", "gae", "gigpo"]
"""The advantage estimators (``learner/advantages.py``'s registry holds one function per name)."""
Discount = Annotated[Float, Gt(0), Le(1)]
"""A discount factor in (0, 1]."""
LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KlEstimator = Literal["k1", "k2", "k3"]
KL_LOSS_ESTIMATORS: tuple[KlEstimator, ...] = ("k2", "k3")
"""Estimators whose gradient as a loss term regularises toward the reference (k1's does not)."""
ReduceGradients = Literal["once_per_step", "every_micro_batch"]


@section
class AlgorithmBase:
    """Which advantage estimator and loss terms the learner uses (see learner/train_step.py): the knobs
    every estimator shares. ``learner.algorithm`` is one of the five sections below, picked by its
    ``advantage`` (a discriminated union): each adds its estimator's own settings, and a setting of
    another estimator is an unknown key, since it would not act."""

    advantage: Advantage = "grpo"
    """``grpo`` (group-normalized outcome), ``rloo`` (leave-one-out baseline), ``reinforce_pp``
    (REINFORCE++: returns whitened across the batch), ``gae`` (PPO with a critic; advantages
    whitened across the batch) or ``gigpo`` (GRPO plus a step advantage per turn among the
    group's turns that answered the same observation)."""
    loss_agg: LossAggregation = "token-mean"
    """``token-mean`` (every assistant token weighs the same), ``seq-mean-token-mean`` (every
    episode weighs the same) or ``seq-mean-token-sum-norm`` (token sums over batch rows times
    ``loss_norm_tokens``, Dr. GRPO's length-unbiased form)."""
    loss_norm_tokens: NonNegativeInt = 0
    """``seq-mean-token-sum-norm`` only: the constant tokens per row it divides by; 0: the run's
    ``rollout.max_episode_tokens``. Not the padded width, so the step size does not change with
    the longest episode of the batch."""
    decoupled: Bool = True
    """Decoupled PPO: clip against the learner's pre-update policy, importance weight
    proximal / behavior capped at ``is_cap``. False: classic PPO-clip of current / behavior."""
    clip_eps: Annotated[Float, Gt(0), Lt(1)] = 0.2
    """PPO clip range of the policy ratio: ``[1 - clip_eps, 1 + clip_eps]`` unless a side is set below."""
    clip_eps_low: Annotated[Float, Ge(0), Lt(1)] = 0.0
    """Lower clip ``1 - clip_eps_low`` of the ratio, in [0, 1); 0: ``clip_eps``."""
    clip_eps_high: NonNegative = 0.0
    """Upper clip ``1 + clip_eps_high`` (DAPO's clip-higher: e.g. 0.28 with 0.2 below, room for
    unlikely good tokens to gain probability); 0: ``clip_eps``."""
    dual_clip_c: NonNegative = 0.0
    """Dual clip (AReaL, arXiv 1912.09729): a token with a negative advantage A loses at most
    ``-c * A`` however far its ratio has grown (e.g. 3.0); must be > 1; 0: off."""
    is_cap: Positive = 2.0
    """Cap C of the truncated importance weight proximal / behavior policy."""
    seq_mask_low: NonNegative = 0.0
    """Drop an episode whose geometric-mean ratio proximal / behavior is below this (0: no bound)."""
    seq_mask_high: NonNegative = 0.0
    """Drop an episode whose geometric-mean ratio proximal / behavior is above this (0: no bound)."""
    kl_coef: NonNegative = 0.0
    """Weight of the KL to a frozen copy of the initial policy; > 0 loads that reference model."""
    kl_estimator: KlEstimator = "k3"
    """As a loss term: ``k2`` (half the squared log ratio; its gradient is that of KL(pi || ref))
    or ``k3`` (low-variance ``exp(r) - 1 - r``, r = log ref - log pi; its gradient is that of
    KL(ref || pi)). ``k1`` (the log ratio) only with ``kl_in_reward``: as a loss its gradient is
    zero in expectation (``learner.losses.kl_to_reference``)."""
    kl_in_reward: Bool = False
    """Subtract ``kl_coef * KL`` from each token's reward (REINFORCE++, InstructGPT) instead of
    adding it to the loss; ``reinforce_pp`` and ``gae`` only."""
    entropy_coef: NonNegative = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    ppo_epochs: Count = 1
    """Passes over each batch; more than one pass (or minibatch) anchors the trust region at the
    pre-update policy, computed once without gradients."""
    minibatches: Count = 1
    """Optimizer steps per pass, each on an equal share of the batch's episodes."""
    format_coef: Annotated[Float, Ge(0), Lt(1)] = 0.0
    """Format reward (``learner/shaping.py``): each turn whose reply held no action in the env's
    format costs ``format_coef / num_turns``; in [0, 1), so task success always outscores it."""

    def __post_init__(self) -> None:
        problems = [message for failed, message in (
            (self.kl_coef > 0 and not self.kl_in_reward and self.kl_estimator not in KL_LOSS_ESTIMATORS,
             f"kl_estimator {self.kl_estimator} as a loss term does not regularise (its gradient is zero in "
             f"expectation on-policy); use {' or '.join(KL_LOSS_ESTIMATORS)}, or k1 with kl_in_reward"),
            (self.loss_norm_tokens > 0 and self.loss_agg != "seq-mean-token-sum-norm",
             "loss_norm_tokens applies to loss_agg seq-mean-token-sum-norm only"),
            (self.dual_clip_c != 0 and not self.dual_clip_c > 1, "dual_clip_c must be > 1 (0: off)"),
            (self.kl_in_reward and self.advantage not in ("reinforce_pp", "gae"),
             "kl_in_reward needs a per-token return: advantage reinforce_pp or gae"),
            (self.kl_in_reward and not self.kl_coef > 0, "kl_in_reward needs kl_coef > 0"),
            (self.kl_coef == 0 and self.kl_estimator != "k3",
             f"kl_estimator {self.kl_estimator} applies only with kl_coef > 0 (kl_coef is 0: no KL term)"),
            (0 < self.seq_mask_high <= self.seq_mask_low, "seq_mask_high must exceed seq_mask_low"),
        ) if failed]
        if problems:
            raise ValueError("learner.algorithm: " + "; ".join(problems))

    @property
    def clip_range(self) -> tuple[float, float]:
        """(eps_low, eps_high) of the ratio clip, each side ``clip_eps`` unless set."""
        return self.clip_eps_low or self.clip_eps, self.clip_eps_high or self.clip_eps




@section
class GrpoAlgorithm(AlgorithmBase):
    """``advantage: grpo``."""

    advantage: Literal["grpo"] = "grpo"
    std_norm: Bool = True
    """Divide GRPO advantages by the group's reward std."""


@section
class RlooAlgorithm(AlgorithmBase):
    """``advantage: rloo``: no settings of its own."""

    advantage: Literal["rloo"] = "rloo"


@section
class ReinforcePpAlgorithm(AlgorithmBase):
    """``advantage: reinforce_pp``."""

    advantage: Literal["reinforce_pp"] = "reinforce_pp"
    gamma: Discount = 1.0
    """Discount per assistant token (env tokens are not discounted)."""


@section
class GaeAlgorithm(AlgorithmBase):
    """``advantage: gae`` (PPO with a critic)."""

    advantage: Literal["gae"] = "gae"
    gamma: Discount = 1.0
    """Discount per assistant token (env tokens are not discounted)."""
    lam: Share = 1.0
    """GAE lambda."""
    value_clip: NonNegative = 0.2
    """Clip range of the critic's update around its old values (0: unclipped)."""
    critic_lr: Positive = 1e-4
    """AdamW learning rate of the critic."""


@section
class GigpoAlgorithm(AlgorithmBase):
    """``advantage: gigpo``."""

    advantage: Literal["gigpo"] = "gigpo"
    gamma: Discount = 1.0
    """Discount per turn of the step returns (GiGPO's paper uses 0.95)."""
    step_advantage_weight: NonNegative = 1.0
    """GiGPO's omega: weight of the step advantage added to the episode advantage."""
    std_norm: Bool = True
    """Divide episode and step advantages by their group's std, as ``grpo``'s ``std_norm``."""


ALGORITHMS: dict[str, type[AlgorithmBase]] = {"grpo": GrpoAlgorithm, "rloo": RlooAlgorithm,
                                              "reinforce_pp": ReinforcePpAlgorithm, "gae": GaeAlgorithm,
                                              "gigpo": GigpoAlgorithm}
"""``advantage`` -> its section."""


def _advantage_of(value: object) -> object:
    """The union's tag: a mapping's ``advantage`` (unset: ``grpo``, the default), a section's own."""
    return value.get("advantage", "grpo") if isinstance(value, dict) else getattr(value, "advantage", None)


AlgorithmConfig = Annotated[
    Annotated[GrpoAlgorithm, Tag("grpo")] | Annotated[RlooAlgorithm, Tag("rloo")]
    | Annotated[ReinforcePpAlgorithm, Tag("reinforce_pp")] | Annotated[GaeAlgorithm, Tag("gae")]
    | Annotated[GigpoAlgorithm, Tag("gigpo")],
    Discriminator(_advantage_of)]
"""``learner.algorithm``: the section of its ``advantage``."""


def algorithm_config(advantage: str = "grpo", **knobs: object) -> AlgorithmBase:
    """The ``learner.algorithm`` section of ``advantage`` with ``knobs`` set (checked as a config's)."""
    if advantage not in ALGORITHMS:
        raise ValueError(f"advantage must be one of {', '.join(ALGORITHMS)}; got {advantage!r}")
    return ALGORITHMS[advantage](**knobs)


def with_advantage(algorithm: AlgorithmBase, advantage: str, **knobs: object) -> AlgorithmBase:
    """``algorithm``'s shared knobs under another estimator (its own settings at their defaults)."""
    shared = {f.name: getattr(algorithm, f.name) for f in dataclasses.fields(AlgorithmBase) if f.name != "advantage"}
    return algorithm_config(advantage, **{**shared, **knobs})


@section
class LearnerConfig:
    num_ranks: Count = 1
    """FSDP ranks (``--learner-gpus``); CPU processes over gloo when there is no GPU."""
    torch_threads: Count = 1
    """Torch intra-op threads per learner rank on CPU."""
    lr: NonNegative = 1e-4
    """AdamW learning rate."""
    lr_warmup_steps: NonNegativeInt = 0
    """Learner steps over which the policy's learning rate rises linearly to ``lr`` (0: none).
    AdamW's first updates, its second moments estimated from a handful of gradients, move every
    weight by about ``lr`` however small the gradient: a fresh policy's first steps then overshoot
    (the default job's share of valid actions dipped after step 2). Counted in optimizer steps
    (``ppo_epochs * minibatches`` a learner step) from the optimizer's own state, so a resume goes on
    where it was."""
    weight_decay: NonNegative = 0.0
    """AdamW weight decay."""
    max_grad_norm: Positive = 1.0
    """Gradient clipping threshold (global norm)."""
    mixed_precision: Bool = False
    """Compute policy and critic in bfloat16 with float32 gradient reduction (FSDP2
    ``MixedPrecisionPolicy``); master weights and optimizer state stay float32 (as always).
    Implied by ``model.dtype: bfloat16``."""
    activation_checkpointing: Bool = False
    """Recompute each decoder layer in backward instead of storing its activations (less
    memory, about one more forward pass of compute)."""
    logprob_chunk_tokens: NonNegativeInt = 1024
    """Token logprobs (and entropy) at the loss positions only, through the LM head this many
    tokens at a time, float32 per chunk, recomputed in backward (``learner/logprobs.py``): memory
    for logits is chunk x vocabulary, not batch x length x vocabulary. 0: full [B, T, V] logits
    (the plain path; also for models whose head is not one linear layer)."""
    micro_batch_tokens: NonNegativeInt = 0
    """Gradient accumulation: each optimizer step runs a rank's rows in micro-batches of at most
    this many padded tokens (rows x longest row; a longer row goes alone); 0: all rows at once.
    The update is the same either way."""
    width_multiple: Count = 64
    """Every forward pass's rows are right-padded (masked) to a width that is a multiple of this
    many tokens, and micro-batches are planned on those widths. On CPU, bfloat16 matmuls (oneDNN)
    keep ~0.5 MB for good for every new row count they meet: with free widths the SmolLM2 learner
    grew ~24 MB a step (README, "Memory over a run"); rounded, each weight meets a few dozen row
    counts. Costs at most ``width_multiple - 1`` padded tokens a row. 1: no rounding."""
    reduce_gradients: ReduceGradients = "once_per_step"
    """With several micro-batches: ``once_per_step`` reduce-scatters the gradients after the last
    only (one reduction per optimizer step; in between each rank holds the unsharded gradients, the
    model's size); ``every_micro_batch`` after each (only gradient shards are held): the choice when
    memory, not the interconnect, is the limit (7B: about 28 GB of float32 gradients per rank)."""
    groups_per_step: Count = 4
    """GRPO groups (task leases) in one learner batch."""
    max_policy_lag: NonNegativeInt = 2
    """Staleness bound S: no lease is admitted that could yield samples more than S versions old;
    a sampled token that still is (a long episode's early turns) is masked from the loss and
    counted, and a group with no fresher token is dropped (``learner/batching.py``)."""
    lease_timeout_s: Positive = 120.0
    """A lease not returned by then is re-issued; late results are discarded and counted."""
    max_group_reissues: NonNegativeInt = 3
    """Re-issues a group (task lease) gets at most: a group whose lease expires after that many is
    dropped, never leased again (a task no actor finishes within ``lease_timeout_s``), and counted
    as ``abandoned`` in the head's ledger (``async/groups_abandoned``). 0: never re-issued."""
    max_message_mb: Annotated[Float, Ge(0.001), Le(4096)] = 64.0
    """Largest message the head accepts from an actor, in MiB (a 32k-token episode is ~0.5 MiB).
    ZeroMQ drops the connection of a peer that sends a larger one before any memory is taken for
    it (the actor reconnects); the head counts dropped connections as ``peer_disconnects``."""
    algorithm: AlgorithmConfig = field(default_factory=GrpoAlgorithm)
    """Advantage estimator, loss terms and update passes."""
    horizon: HorizonConfig = field(default_factory=HorizonConfig)
    """ScalingInter-RL turn-cap schedule."""
    bucket_mb: Positive = 64.0
    """Size of one weight-broadcast bucket in MiB (the learner keeps three for packing). Larger
    buckets mean fewer collectives: on 2 CPU cores SmolLM2's 257 MiB took 0.90 of one raw
    broadcast's speed at 64 MiB, 0.71 at 16 (tests/bench/actor_bench.py)."""
    broadcast_timeout_s: Positive = 60.0
    """Deadline of the weight-broadcast collective."""
    checkpoint_every: NonNegativeInt = 0
    """Save a checkpoint every N steps (0: only at the end)."""
    tb_flush_s: Positive = 5.0
    """Tensorboard flush interval, so a live run shows current values."""
    sample_text_every: NonNegativeInt = 10
    """Every N learner steps, log the step's best and worst episode per env as tensorboard text
    (``samples/<env_id>``, decoded per turn; 0: never)."""
    eval_every: NonNegativeInt = 0
    """Start a validation round on held-out tasks every N learner steps, step 0 included
    (0: no validation); logged as ``eval/<env>/...`` at the step it started (``learner/evaluation.py``)."""
    eval_at_end: Bool = False
    """Also validate the final policy: a round at ``run.max_steps`` that the learner waits for
    (at most ``eval_end_timeout_s``) before it stops, so a run reports held-out success after."""
    eval_at_start: Bool = False
    """Validate the untrained policy and wait for that round before the first update (without it the
    round of step 0 runs beside training, and its later episodes may meet updated weights)."""
    eval_end_timeout_s: Positive = 600.0
    """How long a waited-for validation round (``eval_at_start``, ``eval_at_end``) may take; past it
    the run goes on without it."""
    eval_split: Str = "test"
    """Task split of every env in ``rollout.envs`` that validation draws its tasks from."""
    eval_tasks_per_env: Count = 16
    """Held-out tasks per env in every round: the same evenly spaced subset of ``eval_split``."""
    eval_samples: Count = 4
    """Episodes per held-out task (the eval lease's group size): the n of ``eval/<env>/pass@n``."""
    eval_turn_cap: NonNegativeInt = 0
    """Turn cap of held-out episodes (each env's own limit where lower); 0: the schedule's cap at the
    round's step. Set it to compare rounds, or runs with other schedules, at one horizon."""
