"""How `envhub.envs.agentgym` speaks to AgentGym's env servers: the per-family protocol table
(families.py), the options (options.py), AgentGym's reply parsers (replies.py), reading the servers'
answers (answers.py), and the HTTP calls and reuse of server-side envs (remote.py). The user's
reference is the docstring of envhub/envs/agentgym.py."""
