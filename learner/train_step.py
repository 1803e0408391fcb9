"""One learner update on a batch: advantages, then PPO-style passes over policy and critic.

1. Without gradients, once per batch: the learner's pre-update ("proximal") logprobs when more
   than one optimizer step follows or the KL sits in the reward; the reference logprobs when
   ``kl_coef > 0``; the critic's old values when the estimator is ``gae``.
2. Advantages by ``learner.algorithm.advantage`` (``learner/advantages.py``); REINFORCE++ and GAE
   place each turn's reward at the end of that turn when the episodes carry per-turn rewards.
3. ``ppo_epochs`` passes, each over ``minibatches`` shares of the episodes; per share:
   a. policy: PPO-clip (decoupled: trust region at the proximal policy, truncated importance
      weight proximal / behavior; optional clip-higher and dual clip) on the episodes that pass
      the sequence mask, plus ``kl_coef * KL`` to the reference (k2 or k3, unless it is in the
      reward), minus ``entropy_coef * entropy``; one AdamW step;
   b. critic (``gae``): clipped value loss toward the GAE returns; one step of its own AdamW.

Rows whose advantage is 0 at every token (each episode of a GRPO or RLOO group that all
succeeded or all failed) skip their forward and backward when the loss has no KL or entropy term:
they add exactly 0 to it, and they stay in its denominator, so the update is the same
(``learner/trained_rows_frac`` is the share that ran; the step's ratio and entropy statistics
are of those rows).

With one pass and one share (the default) the proximal policy is the current one before the
step, so no extra forward pass is needed: ``r == 1`` and only the importance weight corrects
the actors' staleness.

Data parallel: every learner rank calls ``Trainer.step`` with the *whole* batch (advantages need
whole groups and batch-wide whitening). No-grad passes run on each rank's rows and are gathered;
each optimizer step trains each rank on its rows of the share (``share[rank::world]``). Every
rank divides its loss by the denominator summed over ranks (``aggregate_parts``) and FSDP2
averages gradients, so the update equals the single-rank one in every aggregation mode.

Gradient accumulation (``learner.micro_batch_tokens``): within one optimizer step a rank runs
its rows in micro-batches (``plan_micro_batches``), each cut to its longest row, forward and
backward each, then one optimizer step. Every micro-batch divides by the denominator of the
whole share, so the summed gradient is the one of a single pass. Ranks agree on the number of
micro-batches and pad with fully masked ones, so all make the same FSDP collectives. The no-grad
passes of step 1 use the same micro-batches when a budget is set.

Logprobs (and entropy) come from ``learner/logprobs.py``: at loss-mask positions only, the LM head
applied ``learner.logprob_chunk_tokens`` tokens at a time, never the [B, T, V] logits. The entropy
carries a gradient only when ``entropy_coef > 0``; otherwise it is computed without one, per chunk,
for the ``learner/entropy`` metric.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.config.learner import LearnerConfig
from learner.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    kl_penalized,
    outcome_token_rewards,
    turn_rewards_summing_to,
    turn_token_rewards,
)
from learner.batching import Batch, round_up
from learner.critic import Critic
from learner.distributed import deal_by_tokens, world
from learner.logprobs import sequence_logprobs
from learner.losses import (
    aggregate_parts,
    kl_to_reference,
    masked_mean,
    ppo_clip_token_losses,
    sequence_keep_mask,
    value_token_losses,
)
from learner.model import learner_device, load_sharded_model
from learner.reference import load_reference_model, reference_logprobs


def train_step(model, optimizer, batch: Batch, cfg: LearnerConfig, temperature: float) -> dict[str, float]:
    """One update without critic or reference (``grpo``/``rloo``/``reinforce_pp``, ``kl_coef == 0``).

    Trains on exactly the rows of ``batch``, with no reduction across ranks; ``Trainer`` is the
    data-parallel and full-featured entry point.
    """
    return Trainer(model, optimizer, cfg, temperature, rank_and_world=(0, 1)).step(batch)


@dataclass
class _BatchConstants:
    """What the passes over one batch hold fixed; [B, T] tensors, None when not needed."""

    advantages: torch.Tensor
    proximal: torch.Tensor | None
    reference: torch.Tensor | None
    old_values: torch.Tensor | None
    returns: torch.Tensor | None
    scalars: dict[str, float]


class Trainer:
    """Policy, its optimizer, and the optional critic and reference model of the algorithm."""

    def __init__(self, policy, optimizer, cfg: LearnerConfig, temperature: float,
                 critic: Critic | None = None, reference: torch.nn.Module | None = None,
                 rank_and_world: tuple[int, int] | None = None, max_episode_tokens: int = 0):
        alg = cfg.algorithm
        # seq-mean-token-sum-norm's constant tokens per row (0 for the other modes, which ignore it)
        sum_norm = alg.loss_agg == "seq-mean-token-sum-norm"
        self.norm_tokens = (alg.loss_norm_tokens or max_episode_tokens) if sum_norm else 0
        if sum_norm and self.norm_tokens <= 0:
            raise ValueError("loss_agg seq-mean-token-sum-norm needs learner.algorithm.loss_norm_tokens > 0 "
                             "or the run's rollout.max_episode_tokens (Trainer.build's max_episode_tokens)")
        if ADVANTAGE_ESTIMATORS[alg.advantage].critic != (critic is not None):
            raise ValueError("a critic is needed exactly when learner.algorithm.advantage reads one (gae); "
                             "Trainer.build creates it")
        if (alg.kl_coef > 0) != (reference is not None):
            raise ValueError("a reference model is needed exactly when learner.algorithm.kl_coef > 0; "
                             "Trainer.build creates it")
        self.policy, self.optimizer, self.cfg, self.temperature = policy, optimizer, cfg, temperature
        self.critic, self.reference = critic, reference
        self.rank, self.world_size = rank_and_world if rank_and_world is not None else world()
        self._shuffle = torch.Generator().manual_seed(0)  # the same minibatch order on every rank
        # [B, T] advantages of the last step's whole batch; rank 0 records them (learner/trained_log.py).
        self.last_advantages: torch.Tensor | None = None

    @classmethod
    def build(cls, model_path: str, dtype: str, cfg: LearnerConfig, temperature: float,
              max_episode_tokens: int = 0) -> Trainer:
        """Load and shard the policy (and critic / reference when the algorithm uses them).
        ``max_episode_tokens``: the run's ``rollout.max_episode_tokens``, the default normaliser of
        ``seq-mean-token-sum-norm``.

        A collective: needs the learner's process group (``learner.model.init_process_group``).
        """
        alg = cfg.algorithm
        memory = dict(mixed_precision=cfg.mixed_precision, activation_checkpointing=cfg.activation_checkpointing)
        policy = load_sharded_model(model_path, dtype, **memory)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        critic = (Critic.build(model_path, dtype, alg.critic_lr, cfg.weight_decay, **memory)
                  if ADVANTAGE_ESTIMATORS[alg.advantage].critic else None)
        reference = load_reference_model(model_path, dtype, cfg.mixed_precision) if alg.kl_coef > 0 else None
        return cls(policy, optimizer, cfg, temperature, critic, reference, max_episode_tokens=max_episode_tokens)

    def rng_state(self) -> dict[str, torch.Tensor]:
        """The generators a checkpoint must hold beside torch's global RNG: the minibatch shuffle
        advances every step, and restarted from its seed it would split the next batch differently."""
        return {"minibatch_shuffle": self._shuffle.get_state()}

    def load_rng_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore ``rng_state()`` output."""
        self._shuffle.set_state(state["minibatch_shuffle"])

    def step(self, batch: Batch) -> dict[str, float]:
        """All passes over the whole ``batch`` (a collective over the learner ranks).

        Returns ``learner/`` and ``optim/`` scalars, means over the optimizer steps, of this
        rank's rows; loss terms are this rank's share of the batch loss times the world size, so
        their mean over ranks (``learner.distributed.mean_over_ranks``) is the batch loss.
        """
        batch = batch.to(learner_device()).padded_to_multiple(self.cfg.width_multiple)
        self.policy.train()
        if self.critic is not None:
            self.critic.model.train()  # from_pretrained leaves it in eval, where HF skips checkpointing
        lengths = batch.attention_mask.sum(dim=1).cpu()  # tokens per row, for dealing rows to ranks
        constants = self._batch_constants(batch, lengths)
        self.last_advantages = constants.advantages
        updates = []
        for _ in range(self.cfg.algorithm.ppo_epochs):
            for share in self._shares(batch.token_ids.shape[0]):
                rows, real = self._my_rows(share, lengths)
                stats = self._update_policy(batch, constants, rows, real)
                if self.critic is not None:
                    stats.update(self._update_critic(batch, constants, rows, real, self._micro_batches(batch, rows)))
                updates.append(stats)
        scalars = _scalars(updates, constants.scalars)
        scalars["optim/lr"] = self.optimizer.param_groups[0]["lr"]
        if self.critic is not None:
            scalars["optim/critic_lr"] = self.critic.optimizer.param_groups[0]["lr"]
        return scalars

    # ------------------------------------------------------------------ once per batch

    def _batch_constants(self, batch: Batch, lengths: torch.Tensor) -> _BatchConstants:
        alg = self.cfg.algorithm
        with torch.no_grad():
            proximal = reference = old_values = None
            # Also with the sequence mask: its keep mask (hence the loss denominator) must be
            # known before the first micro-batch's backward.
            if alg.ppo_epochs * alg.minibatches > 1 or alg.kl_in_reward or alg.seq_mask_low or alg.seq_mask_high:
                proximal = self._gathered(batch, lengths, lambda ids, attention, mask: self._logprobs(
                    self.policy, ids, attention, mask, with_entropy=False)[0])
            if self.reference is not None:
                reference = self._gathered(batch, lengths, lambda ids, attention, mask: reference_logprobs(
                    self.reference, ids, attention, self.temperature, mask, self.cfg.logprob_chunk_tokens))
            if self.critic is not None:
                old_values = self._gathered(batch, lengths,
                                            lambda ids, attention, mask: self.critic.values(ids, attention))
            advantages, returns, scalars = self._advantages(batch, proximal, reference, old_values)
        scalars["advantage_abs_mean"] = float(masked_mean(advantages.abs(), batch.loss_mask))
        return _BatchConstants(advantages, proximal, reference, old_values, returns, scalars)

    def _gathered(self, batch: Batch, lengths: torch.Tensor, forward) -> torch.Tensor:
        """``forward(ids, attention, loss_mask) -> [b, width]`` on this rank's rows, gathered for all
        [B, T] rows.

        Rows are dealt to ranks balanced by tokens (``deal_by_tokens``). Runs in the micro-batches
        of ``micro_batch_tokens`` when set (padded to the same number on every rank with stand-ins,
        results dropped), else in minibatch-sized shares (bounded memory) of this rank's rows padded
        to the same count with row 0, so all ranks make the same FSDP collectives.
        """
        num_rows, width = batch.token_ids.shape
        dealt = deal_by_tokens(lengths, self.world_size)
        per_rank = max(len(rows) for rows in dealt)
        mine = dealt[self.rank].to(batch.token_ids.device)
        padded = torch.cat([mine, mine.new_zeros(per_rank - len(mine))])
        if self.cfg.micro_batch_tokens > 0:
            local = torch.zeros((per_rank, width), device=batch.token_ids.device)
            for micro in self._micro_batches(batch, mine if len(mine) else padded[:1]):
                rows = padded[micro.positions]
                out = forward(batch.token_ids[rows, :micro.width], batch.attention_mask[rows, :micro.width],
                              batch.loss_mask[rows, :micro.width])
                if not micro.dummy:
                    local[micro.positions, :micro.width] = out.to(local.dtype)
        else:
            shares = padded.tensor_split(min(self.cfg.algorithm.minibatches, per_rank))
            local = torch.cat([forward(batch.token_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows])
                               for rows in shares])
        if self.world_size == 1:
            return local
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local.contiguous())
        out = local.new_empty((num_rows, local.shape[1]))
        for rows, part in zip(dealt, parts):
            out[rows.to(out.device)] = part[: len(rows)]
        return out

    def _advantages(self, batch: Batch, proximal, reference, old_values):
        """[B, T] advantages, [B, T] returns (gae) or None, and scalars about them."""
        alg, mask = self.cfg.algorithm, batch.loss_mask
        estimator, scalars, token_rewards = ADVANTAGE_ESTIMATORS[alg.advantage], {}, None
        if estimator.token_rewards:
            scalars, kl = {"reward_on_turns": float(batch.turns is not None)}, None
            if alg.kl_in_reward:
                kl = kl_to_reference(proximal, reference, mask, alg.kl_estimator)
                scalars["kl"] = float(masked_mean(kl, mask))
            token_rewards = kl_penalized(_placed_rewards(batch), mask, kl, alg.kl_coef)
        inputs = AdvantageInputs(batch.rewards, batch.group_index, mask, token_rewards, old_values, batch.turns)
        estimate = estimator.compute(inputs, alg)
        return estimate.advantages, estimate.returns, {**scalars, **estimate.scalars}

    def _shares(self, num_rows: int) -> list[torch.Tensor]:
        """Rows of each optimizer step of one pass; fewer shares than asked if rows are fewer."""
        if self.cfg.algorithm.minibatches == 1:
            return [torch.arange(num_rows)]
        order = torch.randperm(num_rows, generator=self._shuffle)
        return list(order.tensor_split(min(self.cfg.algorithm.minibatches, num_rows)))

    def _my_rows(self, share: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """This rank's rows of ``share``, dealt balanced by tokens (``deal_by_tokens``); a rank
        without any gets row 0 with ``real == False`` (FSDP needs every rank in forward and
        backward; a zero mask makes it count for nothing)."""
        rows = share[deal_by_tokens(lengths[share.cpu()], self.world_size)[self.rank].to(share.device)]
        return (rows, True) if len(rows) else (share[:1], False)

    # ------------------------------------------------------------------ per optimizer step

    def _micro_batches(self, batch: Batch, rows: torch.Tensor,
                       positions: torch.Tensor | None = None) -> list[MicroBatch]:
        """This rank's micro-batches of ``rows`` (of those at ``positions`` only, when given),
        padded with dummies to the count of the rank with the most (every FSDP forward and
        backward is a collective)."""
        positions = torch.arange(len(rows)) if positions is None else positions
        lengths = batch.attention_mask[rows].sum(dim=1)
        widths = round_up(lengths, self.cfg.width_multiple)  # as the forward passes see them (the batch is padded so)
        groups = plan_micro_batches(widths[positions], self.cfg.micro_batch_tokens) if len(positions) else []
        plan = [MicroBatch(positions[group], int(widths[positions[group]].max()), False) for group in groups]
        count = torch.tensor(len(plan))
        # Ranks differ in count with a token budget, or when each skips its rows without a gradient.
        if self.world_size > 1 and (self.cfg.micro_batch_tokens > 0 or self._skips_rows_without_gradient):
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
        # The first two tokens of a real row (rows are right-padded): a stand-in of padding alone
        # could attend to nothing and turn NaN in the backward even with a zero mask, and a whole
        # row would cost as much as a real micro-batch for nothing.
        dummy = MicroBatch(torch.zeros(1, dtype=torch.long), max(1, min(2, int(lengths[0]))), True)
        return plan + [dummy] * (int(count) - len(plan))

    def _update_policy(self, batch: Batch, constants: _BatchConstants, rows: torch.Tensor,
                       real: bool) -> dict[str, float]:
        alg = self.cfg.algorithm
        behavior = batch.behavior_logprobs[rows]
        mask = batch.loss_mask[rows] * float(real)
        proximal = constants.proximal[rows] if constants.proximal is not None else None
        keep, seq_stats = mask, None
        if proximal is not None:  # else no sequence mask (see _batch_constants): all rows stay
            keep_rows, seq_stats = sequence_keep_mask(proximal, behavior, mask, alg.seq_mask_low, alg.seq_mask_high)
            keep = mask * keep_rows[:, None].to(mask.dtype)
        denominator = self._denominator(keep, real)  # of every row: skipped ones stay in the average
        trained = self._rows_with_gradient(constants, rows, keep)
        micro_batches = self._micro_batches(batch, rows, trained)
        self.optimizer.zero_grad(set_to_none=True)
        logprobs, entropy = torch.zeros_like(mask), torch.zeros_like(mask)
        losses = {"loss": 0.0, "pg_loss": 0.0}
        for index, micro in enumerate(micro_batches):
            self._reduce_gradients_after(self.policy, index, len(micro_batches))
            out = self._policy_backward(batch, constants, rows[micro.positions], keep[micro.positions],
                                        micro, denominator)
            for key in losses:
                losses[key] += out[key]
            if not micro.dummy:
                logprobs[micro.positions, :micro.width] = out["logprobs"]
                entropy[micro.positions, :micro.width] = out["entropy"]
        stats = self._policy_stats(batch, constants, rows[trained], mask[trained], keep[trained], logprobs[trained],
                                   seq_stats)
        stats.update(losses, entropy=float(masked_mean(entropy[trained], mask[trained])),
                     trained_rows_frac=len(trained) / len(rows) if real else 0.0)
        self._warm_up_lr()
        stats["grad_norm"], skipped = _clip_and_step(self.policy, self.optimizer, self.cfg.max_grad_norm)
        stats["skipped_zero_grad"] = float(skipped)
        return stats

    @property
    def _skips_rows_without_gradient(self) -> bool:
        """Whether a row's policy loss is only its PPO term (no KL loss term, no entropy bonus)."""
        alg = self.cfg.algorithm
        return alg.entropy_coef == 0 and (self.reference is None or alg.kl_in_reward)

    def _rows_with_gradient(self, constants: _BatchConstants, rows: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Positions into ``rows`` of the rows whose loss has a gradient; the others skip their forward
        and backward, which leaves the update exactly as it was.

        A row whose advantage is 0 at every kept token adds exactly 0 to the PPO term, whatever its
        ratio: GRPO and RLOO give that advantage to every episode of a group that all succeeded or all
        failed, most groups of a hard task. With a KL loss term or an entropy bonus every row counts.
        """
        if not self._skips_rows_without_gradient:
            return torch.arange(len(rows))
        moving = ((constants.advantages[rows] != 0) & (keep > 0)).any(dim=1)
        return moving.nonzero().flatten().cpu()

    def _policy_backward(self, batch: Batch, constants: _BatchConstants, rows: torch.Tensor, keep: torch.Tensor,
                         micro: MicroBatch, denominator: torch.Tensor) -> dict:
        """Forward and backward of one micro-batch (its loss divided by the share's denominator)."""
        alg, width = self.cfg.algorithm, micro.width
        keep = keep[:, :width] * float(not micro.dummy)
        ids, behavior = batch.token_ids[rows, :width], batch.behavior_logprobs[rows, :width]
        # Logprobs at every loss-mask token of the rows (also of a dummy, whose ``keep`` is 0).
        logprobs, entropy = self._logprobs(self.policy, ids, batch.attention_mask[rows, :width],
                                           batch.loss_mask[rows, :width], entropy_grad=alg.entropy_coef > 0)
        proximal = constants.proximal[rows, :width] if constants.proximal is not None else logprobs.detach()
        anchor = proximal if alg.decoupled else behavior  # classic PPO clips current / behavior
        per_token, _ = self._ppo_token_losses(logprobs, anchor, behavior, constants.advantages[rows, :width], keep)
        loss = self._reduce(per_token, keep, denominator)
        pg_loss = float(loss.detach())
        if self.reference is not None and not alg.kl_in_reward:
            kl = kl_to_reference(logprobs, constants.reference[rows, :width], keep, alg.kl_estimator)
            loss = loss + alg.kl_coef * self._reduce(kl, keep, denominator)
        if alg.entropy_coef > 0:
            loss = loss - alg.entropy_coef * self._reduce(entropy, keep, denominator)
        loss.backward()
        return {"loss": float(loss.detach()), "pg_loss": pg_loss, "logprobs": logprobs.detach(),
                "entropy": entropy.detach()}

    def _logprobs(self, model, ids: torch.Tensor, attention: torch.Tensor, loss_mask: torch.Tensor,
                  entropy_grad: bool = False, with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        return sequence_logprobs(model, ids, attention, loss_mask, self.temperature, self.cfg.logprob_chunk_tokens,
                                 entropy_grad=entropy_grad, with_entropy=with_entropy)

    def _ppo_token_losses(self, logprobs, anchor, behavior, advantages, keep) -> tuple[torch.Tensor, dict]:
        alg = self.cfg.algorithm
        eps_low, eps_high = alg.clip_range
        return ppo_clip_token_losses(logprobs, anchor, behavior, advantages, keep, eps_low, alg.is_cap,
                                     clip_eps_high=eps_high, dual_clip_c=alg.dual_clip_c or None)

    def _policy_stats(self, batch: Batch, constants: _BatchConstants, rows: torch.Tensor, mask: torch.Tensor,
                      keep: torch.Tensor, logprobs: torch.Tensor,
                      seq_stats: dict[str, float] | None) -> dict[str, float]:
        """Statistics of the step over the rows it trained (the only ones with logprobs, put back
        together from the micro-batches); ``seq_stats``: the sequence mask's, of every row, when the
        proximal logprobs were there to compute it, else computed here from these rows' own."""
        alg = self.cfg.algorithm
        behavior = batch.behavior_logprobs[rows]
        proximal = constants.proximal[rows] if constants.proximal is not None else logprobs
        stats = dict(seq_stats) if seq_stats is not None else \
            sequence_keep_mask(proximal, behavior, mask, alg.seq_mask_low, alg.seq_mask_high)[1]
        anchor = proximal if alg.decoupled else behavior
        _, pg_stats = self._ppo_token_losses(logprobs, anchor, behavior, constants.advantages[rows], keep)
        stats.update(pg_stats)
        if self.reference is not None and not alg.kl_in_reward:
            kl = kl_to_reference(logprobs, constants.reference[rows], keep, alg.kl_estimator)
            stats["kl"] = float(masked_mean(kl, keep))
        return stats

    def _update_critic(self, batch: Batch, constants: _BatchConstants, rows: torch.Tensor, real: bool,
                       micro_batches: list[MicroBatch]) -> dict[str, float]:
        # Every assistant token trains the critic, including episodes the sequence mask drops
        # from the policy loss: their returns are still valid targets for the sampling policy.
        mask = batch.loss_mask[rows] * float(real)
        old_values, returns = constants.old_values[rows], constants.returns[rows]
        denominator = self._denominator(mask, real)
        self.critic.optimizer.zero_grad(set_to_none=True)
        values, total = torch.zeros_like(mask), 0.0
        for index, micro in enumerate(micro_batches):
            self._reduce_gradients_after(self.critic.model, index, len(micro_batches))
            at, width = micro.positions, micro.width
            micro_mask = mask[at, :width] * float(not micro.dummy)
            predicted = self.critic.model(batch.token_ids[rows[at], :width], batch.attention_mask[rows[at], :width])
            per_token, _ = value_token_losses(predicted, old_values[at, :width], returns[at, :width], micro_mask,
                                              self.cfg.algorithm.value_clip)
            loss = self._reduce(per_token, micro_mask, denominator)
            loss.backward()
            total += float(loss.detach())
            if not micro.dummy:
                values[at, :width] = predicted.detach()
        _, stats = value_token_losses(values, old_values, returns, mask, self.cfg.algorithm.value_clip)
        stats["value_loss"] = total
        stats["critic_grad_norm"], _ = _clip_and_step(self.critic.model, self.critic.optimizer, self.cfg.max_grad_norm)
        return stats

    def _warm_up_lr(self) -> None:
        """With ``lr_warmup_steps``, set the learning rate of the optimizer step about to be taken:
        its share of ``lr`` during the warm-up, ``lr`` after. Without, the optimizer's own is left alone."""
        warmup = self.cfg.lr_warmup_steps * self.cfg.algorithm.ppo_epochs * self.cfg.algorithm.minibatches
        if warmup:
            lr = self.cfg.lr * min(1.0, (_optimizer_steps(self.optimizer) + 1) / warmup)
            for group in self.optimizer.param_groups:
                group["lr"] = lr

    def _reduce_gradients_after(self, model: torch.nn.Module, index: int, count: int) -> None:
        """Whether micro-batch ``index`` of ``count`` reduce-scatters its gradients (FSDP2's
        ``set_requires_gradient_sync``): with ``reduce_gradients: once_per_step`` only the last does,
        the earlier ones accumulate unreduced gradients. Every rank has the same count."""
        set_sync = getattr(model, "set_requires_gradient_sync", None)
        if set_sync is not None:
            set_sync(index == count - 1 or self.cfg.reduce_gradients == "every_micro_batch")

    def _denominator(self, keep: torch.Tensor, real: bool) -> torch.Tensor:
        """The ``loss_agg`` denominator of the whole share (summed over ranks), over world size.

        Dividing by it gives each rank its share of the batch loss times the world size, which
        FSDP2's gradient average turns back into the batch loss.
        """
        _, denominator = aggregate_parts(torch.zeros_like(keep), keep, self.cfg.algorithm.loss_agg, self.norm_tokens)
        denominator = denominator * float(real)  # a stand-in row is not part of the batch
        if self.world_size > 1:
            dist.all_reduce(denominator)
        return denominator.clamp(min=1) / self.world_size

    def _reduce(self, per_token: torch.Tensor, keep: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
        numerator, _ = aggregate_parts(per_token, keep, self.cfg.algorithm.loss_agg, self.norm_tokens)
        return numerator / denominator


def _placed_rewards(batch: Batch) -> torch.Tensor:
    """[B, T] rewards for REINFORCE++ and GAE: each turn's at the end of that turn, the turns of an
    episode summing to its (clipped, shaped) reward; without per-turn rewards (an older recording)
    the episode reward on the last assistant token."""
    if batch.turns is None:
        return outcome_token_rewards(batch.rewards, batch.loss_mask)
    turns, device = batch.turns, batch.rewards.device  # turns stay on the CPU (Batch.to)
    rows = turns.row.to(device)
    rewards = turn_rewards_summing_to(turns.rewards.to(batch.rewards), rows, batch.rewards)
    return turn_token_rewards(rewards, rows, turns.spans, batch.loss_mask)


@dataclass
class MicroBatch:
    """Rows (positions into a rank's rows) of one forward/backward, cut to ``width`` tokens;
    a ``dummy`` one only makes the collectives of a rank with fewer micro-batches and counts
    for nothing."""

    positions: torch.Tensor
    width: int
    dummy: bool


def plan_micro_batches(lengths: torch.Tensor, budget_tokens: int) -> list[torch.Tensor]:
    """Split rows with these token ``lengths`` into groups of at most ``budget_tokens`` padded
    tokens (rows x longest row); a row over the budget goes alone; 0: one group of all rows.

    Rows are taken longest first, so rows of similar length share a group and padding stays low.
    """
    if budget_tokens <= 0 or len(lengths) == 0:
        return [torch.arange(len(lengths))]
    groups: list[list[int]] = []
    for row in torch.argsort(lengths, descending=True, stable=True).tolist():
        if groups and (len(groups[-1]) + 1) * int(lengths[groups[-1][0]]) <= budget_tokens:
            groups[-1].append(row)
        else:
            groups.append([row])
    return [torch.tensor(group) for group in groups]


def _optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    """Steps the optimizer has taken (AdamW counts them per parameter; all move together), as
    restored from a checkpoint."""
    for state in optimizer.state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def _clip_and_step(module: torch.nn.Module, optimizer, max_grad_norm: float) -> tuple[float, bool]:
    """Clip the accumulated gradients to ``max_grad_norm`` and step; returns the pre-clip global
    norm and whether the step was skipped.

    A gradient of exactly 0 (every group of the batch all-success or all-failure, and no KL or
    entropy term) carries no learning signal, but AdamW would still move every weight by its
    momentum and weight decay: step after step of such batches drifts a small model into noise.
    Such a step is skipped; the norm is global, so every rank skips together.
    """
    grad_norm = float(_to_local(torch.nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)))
    skipped = grad_norm == 0.0
    if skipped:
        # No grads at all, not zeros: a checkpoint of an optimizer that never stepped then
        # initializes its state (torch.distributed.checkpoint does so only when no grads exist).
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    return grad_norm, skipped


def _to_local(value: torch.Tensor) -> torch.Tensor:
    # clip_grad_norm_ over DTensor parameters returns a DTensor.
    return value.full_tensor() if hasattr(value, "full_tensor") else value


_OPTIM_KEYS = ("grad_norm", "critic_grad_norm", "skipped_zero_grad")


def _scalars(updates: list[dict[str, float]], batch_scalars: dict[str, float]) -> dict[str, float]:
    """Mean of each statistic over the optimizer steps (max for ``*_max``), with namespaces."""
    out = {f"learner/{k}": v for k, v in batch_scalars.items()}
    for key in updates[0]:
        values = [u[key] for u in updates]
        value = max(values) if key.endswith("_max") else sum(values) / len(values)
        out[f"optim/{key}" if key in _OPTIM_KEYS else f"learner/{key}"] = value
    return out
