"""sciworld-v0: ScienceWorld (the ``scienceworld`` PyPI package, a Scala simulator driven over py4j).

- ``task_index``: the 30 tasks x their variations as one numbered list, and the train/dev/test
  splits ScienceWorld defines (pure data, no JVM: the registry imports it).
- ``jvm_pool``: a process-wide, capped pool of simulator JVMs, borrowed per session and reused.
- ``env``: ``SciWorldEnv``, the envhub environment (prompt, scoring, hint action).
"""
