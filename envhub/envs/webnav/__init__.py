"""webnav-v0: web navigation in headless Chromium with WebArena's observations, actions and evaluators.

env.py (the Environment), actions.py (the action grammar), tabs.py (actions in the browser),
observation.py (the accessibility tree), browser.py (the browser thread and context pool),
tasks.py (WebArena task files), offline_tasks.py (tasks on envhub/sites), evaluators.py,
scripted.py (a scripted policy that solves the offline tasks), agentgym_dialect.py (AgentGym's
WebArena client and server: the default dialect), worked_example.py, fidelity.py (AgentGym fidelity cases).
"""
