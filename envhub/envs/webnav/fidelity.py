"""webnav-v0's AgentGym fidelity cases: replies in AgentGym's grammar on the offline shop, and what
AgentGym's WebArena client and server answer (agentgym_dialect.py names the functions followed).

AgentGym's sites are a WebArena deployment; these cases run on envhub's offline shop, which
AgentGym's server would show the same way: the page as WebArena's accessibility tree, the URL
mapped to WebArena's real-world name (the shop is ``http://onestopmarket.com``), the objective and
the previous action. Needs Chromium (as every webnav-v0 episode does).
"""

from __future__ import annotations

from envhub.envs.webnav.agentgym_dialect import NO_BACKTICKS
from envhub.fidelity import ExpectedStep, FidelityCase

CLIENT = "agentenv/agentenv/envs/webarena.py: WebarenaEnvClient.step"
SERVER = "agentenv-webarena/agentenv_webarena/environment.py: WebarenaEnvServer.step"
PARSER = "agentenv-webarena/webarena/browser_env/actions.py: create_id_based_action"
DESCRIPTION = ("agentenv-webarena/webarena/browser_env/helper_functions.py: get_action_description; "
               "actions.py: action2str")
SUMMARY = "Let's think step-by-step. In summary, the next action I will perform is "
KITCHEN_TASK = "5"
"""Offline task 5: how many products the shop's Kitchen category lists (7); [57] is its link."""
SEARCH_TASK = "8"
"""Offline task 8: search the shop for "kettle"; [9] is the search box."""


def fidelity_cases() -> list[FidelityCase]:
    return [
        FidelityCase(
            "click then stop with the answer", KITCHEN_TASK, source=f"{SERVER}; {DESCRIPTION}", success=True,
            first_observation_contains=("OBSERVATION:\nTab 0 (current): One Stop Market\n\n[1] RootWebArea",
                                        "\nURL: http://onestopmarket.com\nOBJECTIVE: How many products",
                                        "\nPREVIOUS ACTION: None"),
            steps=(
                ExpectedStep(f"{SUMMARY}```click [57]```", score=0.0, done=False, observation_contains=(
                    "URL: http://onestopmarket.com/category/kitchen\n",
                    "PREVIOUS ACTION: click [57] where [57] is link 'Kitchen'")),
                ExpectedStep(f"{SUMMARY}```stop [7]```", score=1.0, done=True,
                             observation_contains=("[27] StaticText '7 items'", "PREVIOUS ACTION: stop [7]")),
            )),
        FidelityCase(
            "a wrong answer scores 0 and ends the episode", KITCHEN_TASK, source=SERVER, success=False,
            steps=(ExpectedStep(f"{SUMMARY}```stop [8]```", score=0.0, done=True,
                                observation_contains=("PREVIOUS ACTION: stop [8]",)),)),
        FidelityCase(
            "no triple backticks: the client refuses; the first block counts", KITCHEN_TASK, source=CLIENT,
            steps=(
                ExpectedStep("Thought: the Kitchen link.\nAction: click [57]", observation=NO_BACKTICKS,
                             score=0.0, done=False),
                ExpectedStep("click [57]", observation=NO_BACKTICKS, score=0.0, done=False),
                ExpectedStep("`click [57]`", observation=NO_BACKTICKS, score=0.0, done=False),
                ExpectedStep(f"{SUMMARY}```click [57]``` and then ```stop [7]```", score=0.0, done=False,
                             observation_contains=("PREVIOUS ACTION: click [57] where [57] is link 'Kitchen'",)),
            )),
        FidelityCase(
            "unparsable actions: the server's error is the observation", KITCHEN_TASK, source=f"{SERVER}; {PARSER}",
            steps=tuple(ExpectedStep(reply, observation=message, score=0.0, done=False) for reply, message in (
                ("```Click [57]```", "Invalid action Click [57]"),
                ("```click 57```", "Invalid click action click 57"),
                ("```scroll [direction=down]```", "Invalid scroll action scroll [direction=down]"),
                ("```tab_focus [first]```", "Invalid tab_focus action tab_focus [first]"),
                ("```python\nclick [57]\n```", "Invalid action python\nclick [57]"),
                ("``````", "list index out of range"),
            ))),
        FidelityCase(
            "type presses Enter by default; an empty stop", SEARCH_TASK, source=f"{PARSER}; {DESCRIPTION}",
            success=True,
            steps=(
                ExpectedStep(f"{SUMMARY}```type [9] [kettle]```", score=0.0, done=False, observation_contains=(
                    "URL: http://onestopmarket.com/search?q=kettle",
                    # WebArena appends the Enter as "\n" and prints it as a space.
                    "PREVIOUS ACTION: type [9] [kettle ] where [9] is searchbox 'Search products'")),
                ExpectedStep(f"{SUMMARY}```stop```", score=1.0, done=True,
                             observation_contains=("PREVIOUS ACTION: stop []",)),
            )),
        FidelityCase(
            "previous-action wording of the other actions", SEARCH_TASK, source=DESCRIPTION,
            steps=(
                ExpectedStep("```type [9] [kettle] [0]```", score=0.0, done=False, observation_contains=(
                    "PREVIOUS ACTION: type [9] [kettle] where [9] is searchbox 'Search products'",)),
                ExpectedStep("```click [9999]```", score=0.0, done=False, observation_contains=(
                    'PREVIOUS ACTION: Attempt to perfom "click" on element "[9999]" but no matching element '
                    "found. Please check the observation more carefully.",)),
                ExpectedStep("```scroll down```", observation_contains=("PREVIOUS ACTION: scroll [down]",)),
                # WebArena clicks the field and types: the text already there stays (execute_action, TYPE).
                ExpectedStep("```type [9] [ electric] [0]```", observation_contains=(
                    "PREVIOUS ACTION: type [9] [ electric] where [9] is searchbox 'Search products'",)),
                ExpectedStep("```press [Enter]```", observation_contains=(
                    "URL: http://onestopmarket.com/search?q=kettle+electric\n", "PREVIOUS ACTION: press [Enter]")),
                ExpectedStep("```goto [http://onestopmarket.com/category/kitchen]```", observation_contains=(
                    "URL: http://onestopmarket.com/category/kitchen\n", "PREVIOUS ACTION: goto [http")),
                ExpectedStep("```go_back```", observation_contains=("PREVIOUS ACTION: go_back",)),
                ExpectedStep("```tab_focus [0]```", observation_contains=("PREVIOUS ACTION: page_focus [0]",)),
                ExpectedStep("```new_tab```", score=0.0, done=False, observation_contains=(
                    "Tab 1 (current)", "URL: about:blank", "PREVIOUS ACTION: new_tab")),
            )),
    ]
