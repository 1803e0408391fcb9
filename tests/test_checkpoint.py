"""A learner checkpoint brings back everything the next update depends on (in process, gloo, world size 1)."""

from __future__ import annotations

import torch

from common.config import Config
from common.config.learner import LearnerConfig, algorithm_config
from learner.policy import ShardedPolicy
from tests.test_train_step import make_batch, snapshot


def test_a_loaded_checkpoint_makes_the_same_next_updates(model_path, tmp_path):
    # The minibatch shuffle generator advances every step; a resume that restarted it from its
    # seed split the next batch into other minibatches, so the resumed run drifted. The critic
    # (GAE) and the frozen reference (a KL term) are the other state the next updates depend on.
    algorithm = algorithm_config(minibatches=2, advantage="gae", kl_coef=0.05, kl_estimator="k3")
    cfg = Config(learner=LearnerConfig(lr=1e-3, algorithm=algorithm))
    straight = ShardedPolicy(cfg, model_path)
    straight.train(make_batch(straight.model, seed=0))
    straight.save(tmp_path, 1, {"step": 1})
    resumed = ShardedPolicy(cfg, model_path)
    assert resumed.load(tmp_path / "checkpoints" / "step_1") == {"step": 1}
    for seed in (1, 2):
        batch = make_batch(straight.model, seed=seed)
        straight.train(batch)
        resumed.train(batch)
    for module in ("policy", "critic"):
        expected, got = snapshot(_module(straight, module)), snapshot(_module(resumed, module))
        assert all(torch.equal(expected[k], got[k]) for k in expected), f"the {module} differs after the resume"


def _module(policy: ShardedPolicy, name: str) -> torch.nn.Module:
    return policy.model if name == "policy" else policy.trainer.critic.model
