"""webnav-v0's ``agentgym`` dialect: AgentGym's WebArena client and server, read from their source.

Followed (WooooDyy/AgentGym): ``agentenv/agentenv/envs/webarena.py`` (``WebarenaEnvClient``: the
instruction, the triple-backtick check), ``agentenv-webarena/agentenv_webarena/environment.py``
(``PromptConstructor._extract_action``, ``map_url_to_real``/``map_url_to_local``,
``WebarenaEnvServer.step``), and in its WebArena copy ``browser_env/actions.py``
(``create_id_based_action``, ``action2str``), ``browser_env/helper_functions.py``
(``get_action_description``) and ``browser_env/env_config.py`` (``URL_MAPPINGS``). One reply:

1. the client: no ```...``` block at all -> ``NO_BACKTICKS``, and the server is never called;
2. the server: the first block's text, stripped, with the sites' real-world URLs mapped to the
   deployment's; parsed by ``create_id_based_action`` (below); a parse error's message is the
   whole observation, and nothing else changes;
3. a parsed action runs; the next observation is WebArena's prompt template with PREVIOUS ACTION
   set to ``get_action_description`` of it (an id not on the page: "Attempt to perfom ...");
4. ``stop [answer]`` ends the episode: reward = the task's evaluator score (the client zeroes
   every other step's reward).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envhub.envs.webnav.actions import WebAction

INSTRUCTION = (
    "You are an autonomous intelligent agent tasked with navigating a web browser. You will be given web-based "
    "tasks. These tasks will be accomplished through the use of specific actions you can issue.\n\n"
    "Here's the information you'll have:\n"
    "The user's objective: This is the task you're trying to complete.\n"
    "The current web page's accessibility tree: This is a simplified representation of the webpage, providing "
    "key information.\n"
    "The current web page's URL: This is the page you're currently navigating.\n"
    "The open tabs: These are the tabs you have open.\n"
    "The previous action: This is the action you just performed. It may be helpful to track your progress.\n\n"
    "The actions you can perform fall into several categories:\n\n"
    "Page Operation Actions:\n"
    "```click [id]```: This action clicks on an element with a specific id on the webpage.\n"
    "```type [id] [content] [0|1]```: Use this to type the content into the field with id. By default, the "
    "\"Enter\" key is pressed after typing unless the last parameter is set to 0.\n"
    "```hover [id]```: Hover over an element with id.\n"
    "`press [key_comb]`:  Simulates the pressing of a key combination on the keyboard (e.g., Ctrl+v).\n"
    "```scroll [down|up]```: Scroll the page up or down to reveal content below or above the current view.\n\n"
    "Tab Management Actions:\n"
    "```new_tab```: Open a new, empty browser tab.\n"
    "```tab_focus [tab_index]```: Switch the browser's focus to a specific tab using its index.\n"
    "```close_tab```: Close the currently active tab.\n\n"
    "URL Navigation Actions:\n"
    "```goto [url]```: Navigate to a specific URL.\n"
    "```go_back```: Navigate to the previously viewed page.\n"
    "```go_forward```: Navigate to the next page (if a previous 'go_back' action was performed).\n\n"
    "Completion Action:\n"
    "```stop [answer]```: Issue this action when you believe the task is complete. If the objective is to find a "
    "text-based answer, provide the answer in the bracket. If you believe the task is impossible to complete, "
    "provide the answer as \"N/A\" in the bracket.\n\n"
    "Homepage:\n"
    "If you want to visit other websites, check out the homepage at http://homepage.com. It has a list of "
    "websites you can visit.\n\n"
    "To be successful, it is very important to follow the following rules:\n"
    "1. You should only issue an action that is valid given the current observation\n"
    "2. You should only issue one action at a time.\n"
    "3. You should follow the examples to reason step by step and then issue the next action.\n"
    "4.For ALL actions that take parameters, you MUST enclose each parameter in square brackets [].\n"
    "5. Generate the action in the correct format. Start with a \"Let's think step-by-step...In summary, the next "
    "action I will perform is\" phrase, followed by action inside triple backticks (```). For example, \"Let's "
    "think step-by-step. This page has a search box whose ID is [164]. According to the nominatim rule of "
    "openstreetmap, I can search for the restaurants near a location by \"restaurants near\". I can submit my "
    "typing by pressing the Enter afterwards. In summary, the next action I will perform is ```type [164] "
    "[restaurants near CMU] [1]```\".\n"
    "6. Issue stop action when you think you have achieved the objective. Don't generate anything after stop."
)
"""``WebarenaEnvClient.conversation_start``'s instruction, word for word (answered "Ok.")."""
NO_BACKTICKS = ("Cannot parse action from response. Your action should be inside triple backticks (```). "
                "Please adjust accordingly.")
REAL_SITE_URLS = {"reddit": "http://reddit.com", "shopping": "http://onestopmarket.com",
                  "shopping_admin": "http://luma.com/admin", "gitlab": "http://gitlab.com",
                  "wikipedia": "http://wikipedia.org", "map": "http://openstreetmap.org",
                  "homepage": "http://homepage.com"}
"""WebArena's ``URL_MAPPINGS``: the real-world URL shown for each site's deployment URL."""

_ANY_BLOCK = re.compile(r"```(.*?)```", re.DOTALL)
_NO_ARGUMENT = ("new_tab", "go_back", "go_forward", "close_tab")
_ELEMENT_ACTIONS = ("click", "hover", "type")
_ID_PATTERNS = {"click": re.compile(r"click ?\[(\d+)\]"), "hover": re.compile(r"hover ?\[(\d+)\]"),
                "tab_focus": re.compile(r"tab_focus ?\[(\d+)\]")}
_TEXT_PATTERNS = {"press": re.compile(r"press ?\[(.+)\]"), "goto": re.compile(r"goto ?\[(.+)\]"),
                  "scroll": re.compile(r"scroll ?\[?(up|down)\]?")}
_TYPE = re.compile(r"type ?\[(\d+)\] ?\[(.+)\] ?\[(\d+)\]")
_STOP = re.compile(r"stop ?\[(.+)\]")


@dataclass(frozen=True)
class ParseFailure:
    """Why AgentGym's server refused the action; ``message`` is the whole observation it returns."""

    message: str


def first_block(reply: str) -> str | None:
    """The first ```...``` block's text, stripped (the client's check, then the server's extraction);
    None when the reply has no block."""
    found = _ANY_BLOCK.search(reply)
    return found.group(1).strip() if found else None


def parse_agentgym_action(text: str) -> WebAction | ParseFailure:
    """``create_id_based_action``: the action's name is what precedes the first "[" (or the first
    word), then a per-action regex is searched (not matched) in the whole text."""
    if "[" in text:
        name = text.split("[")[0].strip()
    elif text.split():
        name = text.split()[0]
    else:
        return ParseFailure("list index out of range")  # what WebArena's text.split()[0] raises on ""
    if name in _NO_ARGUMENT:
        return WebAction(name)
    if name in _ID_PATTERNS:
        found = _ID_PATTERNS[name].search(text)
        if found is None:
            return ParseFailure(f"Invalid {name} action {text}")
        number = int(found.group(1))
        return WebAction(name, text=str(number)) if name == "tab_focus" else WebAction(name, number)
    if name == "type":
        return _parse_type(text)
    if name in _TEXT_PATTERNS:
        found = _TEXT_PATTERNS[name].search(text)
        return WebAction(name, text=found.group(1)) if found else ParseFailure(f"Invalid {name} action {text}")
    if name == "stop":
        found = _STOP.search(text)
        return WebAction("stop", text=found.group(1) if found else "")  # some tasks need no answer
    return ParseFailure(f"Invalid action {text}")


def _parse_type(text: str) -> WebAction | ParseFailure:
    if not text.endswith(("[0]", "[1]")):
        text += " [1]"  # Enter by default
    found = _TYPE.search(text)
    if found is None:
        return ParseFailure(f"Invalid type action {text}")
    # WebArena clicks the field and types (browser_env/actions.py execute_action): nothing is cleared.
    return WebAction("type", int(found.group(1)), found.group(2), found.group(3) == "1", clear_first=False)


def describe_action(action: WebAction, shown_lines: dict[int, str]) -> str:
    """``get_action_description``: the PREVIOUS ACTION line after ``action``, where `shown_lines`
    maps each element id of the page the action was taken on to its observation line."""
    if action.kind in _ELEMENT_ACTIONS:
        line = shown_lines.get(action.element_id)  # type: ignore[arg-type]
        if line is None:
            return (f"Attempt to perfom \"{action.kind}\" on element \"[{action.element_id}]\" but no matching "
                    "element found. Please check the observation more carefully.")
        element = " ".join(line.split()[1:])  # the line without its "[id]"
        if action.kind == "type":  # WebArena appends the Enter as "\n", then prints it as a space
            typed = (action.text + ("\n" if action.press_enter else "")).replace("\n", " ")
            return f"type [{action.element_id}] [{typed}] where [{action.element_id}] is {element}"
        return f"{action.kind} [{action.element_id}] where [{action.element_id}] is {element}"
    if action.kind == "tab_focus":
        return f"page_focus [{action.text}]"  # action2str's name for it
    return action.kind if action.kind in _NO_ARGUMENT else f"{action.kind} [{action.text}]"


def shown_element_lines(tree_text: str) -> dict[int, str]:
    """Element id -> its line (without indentation) in a rendered accessibility tree."""
    lines = {}
    for line in tree_text.splitlines():
        found = re.match(r"\t*\[(\d+)\] ", line)
        if found:
            lines[int(found.group(1))] = line.lstrip("\t")
    return lines


def to_real_url(url: str, site_urls: dict[str, str]) -> str:
    """``map_url_to_real``: a deployment URL with its site's real-world URL."""
    for site, local in site_urls.items():
        local = local.rstrip("/")
        if site in REAL_SITE_URLS and local in url:
            url = url.replace(local, REAL_SITE_URLS[site])
    return url


def to_local_urls(text: str, site_urls: dict[str, str]) -> str:
    """``map_url_to_local``: real-world site URLs (http or https) in `text` with the deployment's."""
    for site, local in site_urls.items():
        real = REAL_SITE_URLS.get(site)
        if real is not None:
            text = text.replace(real, local.rstrip("/")).replace(real.replace("http", "https"), local.rstrip("/"))
    return text
