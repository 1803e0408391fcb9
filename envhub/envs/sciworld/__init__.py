"""sciworld-v0: ScienceWorld (the ``scienceworld`` PyPI package, a Scala simulator driven over py4j).

- ``task_index``: the tasks x their variations as numbered lists, one per dialect (AgentGym's 23
  tasks in ScienceWorld's task-id order; all 30 sorted), and ScienceWorld's train/dev/test splits
  (pure data, no JVM).
- ``jvm_pool``: a process-wide, capped pool of simulator JVMs, borrowed per session and reused.
- ``rules``, ``agentgym_rules``, ``lenient_rules``: what each dialect decides (reply parsing, first
  observation, scores, end of an episode); ``example``: the worked example in AgentGym's grammar.
- ``env``: ``SciWorldEnv``, the envhub environment; ``fidelity``: AgentGym fidelity cases.
"""
