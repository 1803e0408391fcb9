"""docs/configuration.md is what common/config_reference.py generates from the config dataclasses."""

from common import config_reference


def test_the_checked_in_config_reference_matches_the_code():
    generated = config_reference.reference()
    assert config_reference.REFERENCE.read_text() == generated, \
        "docs/configuration.md is stale: run `python -m common.config_reference --write`"
    for section in ("run", "model", "rollout", "envhub", "actors", "learner", "learner.horizon"):
        assert f"## `{section}`" in generated
    assert "| `vllm_kv_cache_mb` |" in generated  # a field added to a role's config shows up
