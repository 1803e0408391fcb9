"""Configuration of the learner (``learner:`` section)."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal

Advantage = Literal["grpo", "rloo", "reinforce_pp", "gae", "gigpo"]
"""The advantage estimators (``learner/advantages.py``'s registry holds one function per name)."""
LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KlEstimator = Literal["k1", "k2", "k3"]
KL_LOSS_ESTIMATORS: tuple[KlEstimator, ...] = ("k2", "k3")
"""Estimators whose gradient as a loss term regularises toward the reference (k1's does not)."""
ReduceGradients = Literal["once_per_step", "every_micro_batch"]
HorizonKind = Literal["fixed", "stepwise", "adaptive"]


@dataclass(frozen=True)
class HorizonConfig:
    """ScalingInter-RL turn-cap schedule; see ``learner/horizon.py`` for the step convention."""

    kind: HorizonKind = "stepwise"
    """``fixed`` (one cap), ``stepwise`` (stages start at set steps) or ``adaptive`` (raised on
    truncation at the cap plus a success plateau)."""
    turn_caps: list[int] = field(default_factory=lambda: [4, 6, 8])
    """Turn cap of each stage, non-decreasing (ScalingInter-RL: small first, then longer
    horizons); exactly one for ``fixed``, at least two for ``adaptive``."""
    boundaries: list[int] = field(default_factory=lambda: [10, 20])
    """``stepwise`` only: optimizer steps at which stage i+1 starts, one fewer than
    ``turn_caps``; set ``[]`` when using ``boundary_fractions`` or another kind."""
    boundary_fractions: list[float] = field(default_factory=list)
    """``stepwise`` only, instead of ``boundaries``: stage starts as fractions of
    ``run.max_steps`` in (0, 1), rounded half up to steps."""
    truncation_threshold: float = 0.3
    """``adaptive``: raise only if the mean share of episodes truncated at the cap over the
    window is at least this."""
    plateau_window: int = 5
    """``adaptive``: observed learner steps (of the current stage) that a decision looks at."""
    plateau_tolerance: float = 0.02
    """``adaptive``: success plateaued if its mean over the newer half of the window exceeds
    the older half's by less than this."""
    min_stage_steps: int = 10
    """``adaptive``: never raise before the stage is this many steps old; at least
    ``plateau_window + learner.max_policy_lag`` (0 in sync mode), checked when the config loads, so
    stale episodes of the old cap do not decide."""


@dataclass(frozen=True)
class GrpoSettings:
    """``learner.algorithm.grpo``: settings of the ``grpo`` estimator."""

    std_norm: bool = True
    """Divide GRPO advantages by the group's reward std."""


@dataclass(frozen=True)
class ReinforcePpSettings:
    """``learner.algorithm.reinforce_pp``: settings of the ``reinforce_pp`` estimator."""

    gamma: float = 1.0
    """Discount per assistant token (env tokens are not discounted)."""


@dataclass(frozen=True)
class GaeSettings:
    """``learner.algorithm.gae``: settings of the ``gae`` estimator (PPO with a critic)."""

    gamma: float = 1.0
    """Discount per assistant token (env tokens are not discounted)."""
    lam: float = 1.0
    """GAE lambda."""
    value_clip: float = 0.2
    """Clip range of the critic's update around its old values (0: unclipped)."""
    critic_lr: float = 1e-4
    """AdamW learning rate of the critic."""


@dataclass(frozen=True)
class GigpoSettings:
    """``learner.algorithm.gigpo``: settings of the ``gigpo`` estimator."""

    gamma: float = 1.0
    """Discount per turn of the step returns (GiGPO's paper uses 0.95)."""
    step_advantage_weight: float = 1.0
    """GiGPO's omega: weight of the step advantage added to the episode advantage."""
    std_norm: bool = True
    """Divide episode and step advantages by their group's std, as ``grpo.std_norm``."""


EstimatorSettings = GrpoSettings | ReinforcePpSettings | GaeSettings | GigpoSettings
ESTIMATOR_SETTINGS: dict[str, type] = {"grpo": GrpoSettings, "reinforce_pp": ReinforcePpSettings,
                                       "gae": GaeSettings, "gigpo": GigpoSettings}
"""Estimator -> its settings section (a field of ``AlgorithmConfig`` of the same name); ``rloo`` has none."""


@dataclass(frozen=True)
class AlgorithmConfig:
    """Which advantage estimator and loss terms the learner uses (see learner/train_step.py).

    The estimator's own settings live in the section named after it (``gae: {lam: 0.95}``); a
    section of an estimator that is not ``advantage`` is an error, since none of its knobs would act.
    """

    advantage: Advantage = "grpo"
    """``grpo`` (group-normalized outcome), ``rloo`` (leave-one-out baseline), ``reinforce_pp``
    (REINFORCE++: returns whitened across the batch), ``gae`` (PPO with a critic; advantages
    whitened across the batch) or ``gigpo`` (GRPO plus a step advantage per turn among the
    group's turns that answered the same observation)."""
    grpo: GrpoSettings | None = None
    """``grpo`` only: its settings; unset: the defaults."""
    reinforce_pp: ReinforcePpSettings | None = None
    """``reinforce_pp`` only: its settings; unset: the defaults."""
    gae: GaeSettings | None = None
    """``gae`` only: its settings; unset: the defaults."""
    gigpo: GigpoSettings | None = None
    """``gigpo`` only: its settings; unset: the defaults."""
    loss_agg: LossAggregation = "token-mean"
    """``token-mean`` (every assistant token weighs the same), ``seq-mean-token-mean`` (every
    episode weighs the same) or ``seq-mean-token-sum-norm`` (token sums over batch rows times
    ``loss_norm_tokens``, Dr. GRPO's length-unbiased form)."""
    loss_norm_tokens: int = 0
    """``seq-mean-token-sum-norm`` only: the constant tokens per row it divides by; 0: the run's
    ``rollout.max_episode_tokens``. Not the padded width, so the step size does not change with
    the longest episode of the batch."""
    decoupled: bool = True
    """Decoupled PPO: clip against the learner's pre-update policy, importance weight
    proximal / behavior capped at ``is_cap``. False: classic PPO-clip of current / behavior."""
    clip_eps: float = 0.2
    """PPO clip range of the policy ratio: ``[1 - clip_eps, 1 + clip_eps]`` unless a side is set below."""
    clip_eps_low: float = 0.0
    """Lower clip ``1 - clip_eps_low`` of the ratio, in [0, 1); 0: ``clip_eps``."""
    clip_eps_high: float = 0.0
    """Upper clip ``1 + clip_eps_high`` (DAPO's clip-higher: e.g. 0.28 with 0.2 below, room for
    unlikely good tokens to gain probability); 0: ``clip_eps``."""
    dual_clip_c: float = 0.0
    """Dual clip (AReaL, arXiv 1912.09729): a token with a negative advantage A loses at most
    ``-c * A`` however far its ratio has grown (e.g. 3.0); must be > 1; 0: off."""
    is_cap: float = 2.0
    """Cap C of the truncated importance weight proximal / behavior policy."""
    seq_mask_low: float = 0.0
    """Drop an episode whose geometric-mean ratio proximal / behavior is below this (0: no bound)."""
    seq_mask_high: float = 0.0
    """Drop an episode whose geometric-mean ratio proximal / behavior is above this (0: no bound)."""
    kl_coef: float = 0.0
    """Weight of the KL to a frozen copy of the initial policy; > 0 loads that reference model."""
    kl_estimator: KlEstimator = "k3"
    """As a loss term: ``k2`` (half the squared log ratio; its gradient is that of KL(pi || ref))
    or ``k3`` (low-variance ``exp(r) - 1 - r``, r = log ref - log pi; its gradient is that of
    KL(ref || pi)). ``k1`` (the log ratio) only with ``kl_in_reward``: as a loss its gradient is
    zero in expectation (``learner.losses.kl_to_reference``)."""
    kl_in_reward: bool = False
    """Subtract ``kl_coef * KL`` from each token's reward (REINFORCE++, InstructGPT) instead of
    adding it to the loss; ``reinforce_pp`` and ``gae`` only."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    ppo_epochs: int = 1
    """Passes over each batch; more than one pass (or minibatch) anchors the trust region at the
    pre-update policy, computed once without gradients."""
    minibatches: int = 1
    """Optimizer steps per pass, each on an equal share of the batch's episodes."""
    format_coef: float = 0.0
    """Format reward (``learner/shaping.py``): each turn whose reply held no action in the env's
    format costs ``format_coef / num_turns``; in [0, 1), so task success always outscores it."""

    def __post_init__(self) -> None:
        _check_choice("advantage", self.advantage, Advantage)
        _check_choice("loss_agg", self.loss_agg, LossAggregation)
        _check_choice("kl_estimator", self.kl_estimator, KlEstimator)
        self._check_estimator_sections()
        problems = [message for failed, message in (
            (self.kl_coef > 0 and not self.kl_in_reward and self.kl_estimator not in KL_LOSS_ESTIMATORS,
             f"kl_estimator {self.kl_estimator} as a loss term does not regularise (its gradient is zero in "
             f"expectation on-policy); use {' or '.join(KL_LOSS_ESTIMATORS)}, or k1 with kl_in_reward"),
            (self.loss_norm_tokens < 0, "loss_norm_tokens must be >= 0 (0: rollout.max_episode_tokens)"),
            (self.loss_norm_tokens > 0 and self.loss_agg != "seq-mean-token-sum-norm",
             "loss_norm_tokens applies to loss_agg seq-mean-token-sum-norm only"),
            (not 0 <= self.clip_eps_low < 1 or self.clip_eps_high < 0,
             "need 0 <= clip_eps_low < 1 and clip_eps_high >= 0 (0: clip_eps)"),
            (self.dual_clip_c != 0 and not self.dual_clip_c > 1, "dual_clip_c must be > 1 (0: off)"),
            (self.kl_in_reward and self.advantage not in ("reinforce_pp", "gae"),
             "kl_in_reward needs a per-token return: advantage reinforce_pp or gae"),
            (self.kl_in_reward and not self.kl_coef > 0, "kl_in_reward needs kl_coef > 0"),
            (self.kl_coef == 0 and self.kl_estimator != "k3",
             f"kl_estimator {self.kl_estimator} applies only with kl_coef > 0 (kl_coef is 0: no KL term)"),
            (not 0 < self.clip_eps < 1 or not self.is_cap > 0, "need 0 < clip_eps < 1 and is_cap > 0"),
            (min(self.seq_mask_low, self.seq_mask_high, self.kl_coef, self.entropy_coef) < 0,
             "seq_mask_*, kl_coef, entropy_coef must be >= 0"),
            (0 < self.seq_mask_high <= self.seq_mask_low, "seq_mask_high must exceed seq_mask_low"),
            (self.ppo_epochs < 1 or self.minibatches < 1, "ppo_epochs and minibatches must be >= 1"),
            (not 0 <= self.format_coef < 1, "format_coef must be in [0, 1) so that task success outscores it"),
            *_settings_problems(self.settings),
        ) if failed]
        if problems:
            raise ValueError("learner.algorithm: " + "; ".join(problems))

    def _check_estimator_sections(self) -> None:
        """Only the selected estimator's section may be set; it is kept unset when it holds only
        defaults, so a config reads the same however it was written (and ``dataclasses.replace``
        may switch estimators)."""
        for name, settings_type in ESTIMATOR_SETTINGS.items():
            section = getattr(self, name)
            if section is not None and name != self.advantage:
                raise ValueError(f"learner.algorithm.{name} is set, but it applies only to advantage {name}; "
                                 f"advantage is {self.advantage}")
            if section is not None and not isinstance(section, settings_type):
                raise ValueError(f"learner.algorithm.{name} must be {settings_type.__name__}, got {section!r}")
            if section == settings_type():
                object.__setattr__(self, name, None)

    @property
    def settings(self) -> EstimatorSettings | None:
        """The selected estimator's settings: its section, or that section's defaults (None for ``rloo``)."""
        settings_type = ESTIMATOR_SETTINGS.get(self.advantage)
        return None if settings_type is None else getattr(self, self.advantage) or settings_type()

    @property
    def clip_range(self) -> tuple[float, float]:
        """(eps_low, eps_high) of the ratio clip, each side ``clip_eps`` unless set."""
        return self.clip_eps_low or self.clip_eps, self.clip_eps_high or self.clip_eps


def _settings_problems(settings: EstimatorSettings | None) -> list[tuple[bool, str]]:
    """(failed, message) of each check of the selected estimator's settings."""
    gamma, lam = getattr(settings, "gamma", 1.0), getattr(settings, "lam", 1.0)
    return [
        (not 0 < gamma <= 1 or not 0 <= lam <= 1, "need 0 < gamma <= 1 and 0 <= lam <= 1"),
        (getattr(settings, "value_clip", 0.0) < 0, "gae.value_clip must be >= 0"),
        (getattr(settings, "step_advantage_weight", 0.0) < 0, "step_advantage_weight must be >= 0"),
    ]


def _check_choice(name: str, value: str, choices: Any) -> None:
    if value not in typing.get_args(choices):
        raise ValueError(f"learner.algorithm.{name} must be one of {', '.join(typing.get_args(choices))}; "
                         f"got {value!r}")


@dataclass(frozen=True)
class LearnerConfig:
    num_ranks: int = 1
    """FSDP ranks (``--learner-gpus``); CPU processes over gloo when there is no GPU."""
    torch_threads: int = 1
    """Torch intra-op threads per learner rank on CPU."""
    lr: float = 1e-4
    """AdamW learning rate."""
    lr_warmup_steps: int = 0
    """Learner steps over which the policy's learning rate rises linearly to ``lr`` (0: none).
    AdamW's first updates, its second moments estimated from a handful of gradients, move every
    weight by about ``lr`` however small the gradient: a fresh policy's first steps then overshoot
    (the default job's share of valid actions dipped after step 2). Counted in optimizer steps
    (``ppo_epochs * minibatches`` a learner step) from the optimizer's own state, so a resume goes on
    where it was."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (global norm)."""
    mixed_precision: bool = False
    """Compute policy and critic in bfloat16 with float32 gradient reduction (FSDP2
    ``MixedPrecisionPolicy``); master weights and optimizer state stay float32 (as always).
    Implied by ``model.dtype: bfloat16``."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer in backward instead of storing its activations (less
    memory, about one more forward pass of compute)."""
    logprob_chunk_tokens: int = 1024
    """Token logprobs (and entropy) at the loss positions only, through the LM head this many
    tokens at a time, float32 per chunk, recomputed in backward (``learner/logprobs.py``): memory
    for logits is chunk x vocabulary, not batch x length x vocabulary. 0: full [B, T, V] logits
    (the plain path; also for models whose head is not one linear layer)."""
    micro_batch_tokens: int = 0
    """Gradient accumulation: each optimizer step runs a rank's rows in micro-batches of at most
    this many padded tokens (rows x longest row; a longer row goes alone); 0: all rows at once.
    The update is the same either way."""
    width_multiple: int = 64
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
    groups_per_step: int = 4
    """GRPO groups (task leases) in one learner batch."""
    max_policy_lag: int = 2
    """Staleness bound S: no lease is admitted that could yield samples more than S versions old;
    a sampled token that still is (a long episode's early turns) is masked from the loss and
    counted, and a group with no fresher token is dropped (``learner/batching.py``)."""
    lease_timeout_s: float = 120.0
    """A lease not returned by then is re-issued; late results are discarded and counted."""
    max_group_reissues: int = 3
    """Re-issues a group (task lease) gets at most: a group whose lease expires after that many is
    dropped, never leased again (a task no actor finishes within ``lease_timeout_s``), and counted
    as ``abandoned`` in the head's ledger (``async/groups_abandoned``). 0: never re-issued."""
    max_message_mb: float = 64.0
    """Largest message the head accepts from an actor, in MiB (a 32k-token episode is ~0.5 MiB).
    ZeroMQ drops the connection of a peer that sends a larger one before any memory is taken for
    it (the actor reconnects); the head counts dropped connections as ``peer_disconnects``."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator, loss terms and update passes."""
    horizon: HorizonConfig = field(default_factory=HorizonConfig)
    """ScalingInter-RL turn-cap schedule."""
    bucket_mb: float = 64.0
    """Size of one weight-broadcast bucket in MiB (the learner keeps three for packing). Larger
    buckets mean fewer collectives: on 2 CPU cores SmolLM2's 257 MiB took 0.90 of one raw
    broadcast's speed at 64 MiB, 0.71 at 16 (tests/bench/actor_bench.py)."""
    broadcast_timeout_s: float = 60.0
    """Deadline of the weight-broadcast collective."""
    checkpoint_every: int = 0
    """Save a checkpoint every N steps (0: only at the end)."""
    tb_flush_s: float = 5.0
    """Tensorboard flush interval, so a live run shows current values."""
    sample_text_every: int = 10
    """Every N learner steps, log the step's best and worst episode per env as tensorboard text
    (``samples/<env_id>``, decoded per turn; 0: never)."""
    eval_every: int = 0
    """Start a validation round on held-out tasks every N learner steps, step 0 included
    (0: no validation); logged as ``eval/<env>/...`` at the step it started (``learner/evaluation.py``)."""
    eval_at_end: bool = False
    """Also validate the final policy: a round at ``run.max_steps`` that the learner waits for
    (at most ``eval_end_timeout_s``) before it stops, so a run reports held-out success after."""
    eval_at_start: bool = False
    """Validate the untrained policy and wait for that round before the first update (without it the
    round of step 0 runs beside training, and its later episodes may meet updated weights)."""
    eval_end_timeout_s: float = 600.0
    """How long a waited-for validation round (``eval_at_start``, ``eval_at_end``) may take; past it
    the run goes on without it."""
    eval_split: str = "test"
    """Task split of every env in ``rollout.envs`` that validation draws its tasks from."""
    eval_tasks_per_env: int = 16
    """Held-out tasks per env in every round: the same evenly spaced subset of ``eval_split``."""
    eval_samples: int = 4
    """Episodes per held-out task (the eval lease's group size): the n of ``eval/<env>/pass@n``."""
    eval_turn_cap: int = 0
    """Turn cap of held-out episodes (each env's own limit where lower); 0: the schedule's cap at the
    round's step. Set it to compare rounds, or runs with other schedules, at one horizon."""

    def __post_init__(self) -> None:
        if self.logprob_chunk_tokens < 0:
            raise ValueError(f"learner.logprob_chunk_tokens must be >= 0 (0: off); got {self.logprob_chunk_tokens}")
        if self.micro_batch_tokens < 0:
            raise ValueError(f"learner.micro_batch_tokens must be >= 0 (0: off); got {self.micro_batch_tokens}")
        if self.width_multiple < 1:
            raise ValueError(f"learner.width_multiple must be >= 1 (1: no rounding); got {self.width_multiple}")
        if self.reduce_gradients not in typing.get_args(ReduceGradients):
            raise ValueError("learner.reduce_gradients must be once_per_step or every_micro_batch; got "
                             f"{self.reduce_gradients!r}")
        if self.lr_warmup_steps < 0:
            raise ValueError(f"learner.lr_warmup_steps must be >= 0 (0: none); got {self.lr_warmup_steps}")
        if self.max_group_reissues < 0:
            raise ValueError(f"learner.max_group_reissues must be >= 0; got {self.max_group_reissues}")
        if self.sample_text_every < 0:
            raise ValueError(f"sample_text_every must be >= 0, got {self.sample_text_every}")
        if not 0.001 <= self.max_message_mb <= 4096:
            raise ValueError(f"learner.max_message_mb must be in [0.001, 4096] MiB, got {self.max_message_mb}")
        if self.eval_every < 0 or self.eval_tasks_per_env < 1 or self.eval_samples < 1 or self.eval_turn_cap < 0:
            raise ValueError("eval_every and eval_turn_cap must be >= 0, eval_tasks_per_env and eval_samples >= 1")
