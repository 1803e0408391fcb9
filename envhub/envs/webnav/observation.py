"""WebArena's text observation: Chromium's accessibility tree with element ids.

One line per node, ``[id] role 'name' property: value``, indented by depth. The id is the node's
position in the page's full accessibility tree (depth-first), so it is the same for the same page
in every session and does not change when scrolling (Chromium's own node ids depend on the
renderer's history); ``click [id]`` resolves it to the node's DOM element. As in
WebArena: nodes without a role's worth of content (empty generic, paragraph, list item ...) are
dropped and their children lifted; a StaticText repeating one of the three lines before it is
dropped; with ``viewport_only`` a node less than 60% inside the viewport is dropped too (its
children stay if they are inside), so ``scroll`` reveals the rest of a long page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IGNORED_PROPERTIES = frozenset({"focusable", "editable", "readonly", "level", "settable", "multiline", "invalid",
                                "url"})
EMPTY_WHEN_UNNAMED = frozenset({"generic", "img", "list", "strong", "paragraph", "banner", "navigation", "Section",
                                "LabelText", "Legend", "listitem", "none", "Ignored"})
SKIPPED_ROLES = frozenset({"InlineTextBox", "LineBreak", "ListMarker"})
IN_VIEWPORT_RATIO = 0.6
Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class PageTree:
    """A rendered accessibility tree and the ids it shows."""

    text: str
    element_ids: dict[int, int]
    """Shown id -> backend DOM node id, for the nodes shown: the only ids an action may use."""


def render_tree(ax_nodes: list[dict[str, Any]], boxes: dict[int, Box] | None, viewport: Box) -> PageTree:
    """Render CDP ``Accessibility.getFullAXTree`` nodes; `boxes` (backend id -> layout box) filters to the viewport."""
    by_id = {node["nodeId"]: node for node in ax_nodes}
    roots = [node for node in ax_nodes if not node.get("parentId") or node["parentId"] not in by_id]
    lines: list[str] = []
    shown: dict[int, int] = {}
    stack = [(roots[0], 0)] if roots else []  # depth-first, iterative: pages can nest deeper than recursion allows
    position = 0
    while stack:
        node, depth = stack.pop()
        position += 1
        line = _node_line(node, boxes, viewport, is_root=node is roots[0])
        if line is not None and _repeats_text(line, lines):
            line = None
        if line is not None:
            lines.append("\t" * depth + f"[{position}] {line}")
            shown[position] = int(node["backendDOMNodeId"])
        children = [by_id[child_id] for child_id in node.get("childIds", []) if child_id in by_id]
        stack.extend((child, depth + (line is not None)) for child in reversed(children))
    return PageTree("\n".join(lines), shown)


def _node_line(node: dict[str, Any], boxes: dict[int, Box] | None, viewport: Box, is_root: bool) -> str | None:
    role = (node.get("role") or {}).get("value", "")
    if node.get("ignored") or role in SKIPPED_ROLES or "backendDOMNodeId" not in node:
        return None
    name = str((node.get("name") or {}).get("value", "")).strip()
    properties = [f"{p['name']}: {p['value']['value']}" for p in node.get("properties", [])
                  if p.get("name") not in IGNORED_PROPERTIES and "value" in p.get("value", {})]
    if not name and not properties and role in EMPTY_WHEN_UNNAMED:
        return None
    if not name and role == "listitem":
        return None
    if boxes is not None and not is_root and not _in_viewport(boxes.get(node["backendDOMNodeId"]), viewport):
        return None
    line = f"{role} {name!r}"
    return line + (" " + " ".join(properties) if properties else "")


def _in_viewport(box: Box | None, viewport: Box) -> bool:
    if box is None or box[2] <= 0 or box[3] <= 0:
        return False
    x, y, width, height = box
    left, top, view_width, view_height = viewport
    overlap_x = max(0.0, min(x + width, left + view_width) - max(x, left))
    overlap_y = max(0.0, min(y + height, top + view_height) - max(y, top))
    return overlap_x * overlap_y / (width * height) >= IN_VIEWPORT_RATIO


def _repeats_text(line: str, kept: list[str]) -> bool:
    """WebArena's cleanup: a StaticText whose text is already in one of the 3 lines before it says nothing new."""
    if not line.startswith("StaticText "):
        return False
    text = line[len("StaticText "):].strip()[1:-1]
    return not text or any(text in previous for previous in kept[-3:])


def layout_boxes(snapshot: dict[str, Any]) -> dict[int, Box]:
    """Backend DOM id -> layout box (document coordinates) from CDP ``DOMSnapshot.captureSnapshot``."""
    boxes: dict[int, Box] = {}
    for document in snapshot.get("documents", [])[:1]:  # the main frame; iframes are not shown
        backend_ids = document["nodes"]["backendNodeId"]
        layout = document["layout"]
        for node_index, bounds in zip(layout["nodeIndex"], layout["bounds"]):
            boxes.setdefault(backend_ids[node_index], tuple(bounds[:4]))  # type: ignore[arg-type]
    return boxes


def truncate(text: str, max_chars: int) -> str:
    """Cut `text` at a line boundary to fit `max_chars`, saying so."""
    if len(text) <= max_chars:
        return text
    note = "\n... (the page is longer than the observation; scroll or navigate to see more)"
    cut = text.rfind("\n", 0, max_chars - len(note))
    return text[:cut if cut > 0 else max_chars - len(note)] + note
