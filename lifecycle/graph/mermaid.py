"""Mermaid ``stateDiagram-v2`` renderings (GitHub renders them; the golden graphs are these)."""

from __future__ import annotations

from lifecycle.graph.model import INACTIVE_MARK, GraphJSON, MachineJSON, StateJSON, edge_label

MERMAID_CLASSES: dict[str, str] = {
    "terminal": "stroke-width:3px",
    "marked": "fill:#fdecea,stroke:#c62828,stroke-width:2px,color:#7f1d1d",
    "markedTerminal": "fill:#fdecea,stroke:#c62828,stroke-width:4px,color:#7f1d1d",
    "unreachable": "fill:#f2f2f2,stroke:#9e9e9e,stroke-dasharray:4 3,color:#9e9e9e",
    "unreachableMarked": "fill:#f2f2f2,stroke:#e57373,stroke-dasharray:4 3,color:#9e9e9e",
}


def state_class(state: StateJSON) -> str | None:
    """The one visual class of a state (mermaid gives a state one style; combinations are explicit)."""
    if not state["reachable"]:
        return "unreachableMarked" if state["marked"] else "unreachable"
    if state["marked"]:
        return "markedTerminal" if state["terminal"] else "marked"
    return "terminal" if state["terminal"] else None


def _mermaid_text(text: str) -> str:
    """Keep a label on one mermaid line; ``;`` ``#`` ``:`` ``<`` ``>`` confuse its lexer."""
    for bad, good in ((";", ","), ("#", "no."), (":", " "), ("<", "\u2039"), (">", "\u203a"), ("\n", " ")):
        text = text.replace(bad, good)
    return text


def to_mermaid(machine: MachineJSON, *, title: str | None = None) -> str:
    """A ``stateDiagram-v2`` that GitHub renders; inactive edges carry ``✗`` in their label."""
    lines = ["stateDiagram-v2"]
    if title:
        lines.append(f"    %% {title}")
    names = {s["name"] for s in machine["states"]}
    for s in machine["states"]:
        lines.append(f"    {s['name']}")  # declared in spec order so the layout follows the spec
    if machine["initial"] in names:
        lines.append(f"    [*] --> {machine['initial']}")
    for e in machine["edges"]:
        label = _mermaid_text(edge_label(e))
        if not e["active"]:
            label = f"{INACTIVE_MARK} {label}"
        lines.append(f"    {e['source']} --> {e['dest']} : {label}")
    for s in machine["states"]:
        if s["terminal"]:
            lines.append(f"    {s['name']} --> [*]")
    used: dict[str, list[str]] = {}
    for s in machine["states"]:
        cls = state_class(s)
        if cls:
            used.setdefault(cls, []).append(s["name"])
    for cls, style in MERMAID_CLASSES.items():
        if cls in used:
            lines.append(f"    classDef {cls} {style}")
    for cls in MERMAID_CLASSES:
        if cls in used:
            lines.append(f"    class {','.join(used[cls])} {cls}")
    return "\n".join(lines) + "\n"


def to_mermaid_markdown(doc: GraphJSON) -> str:
    """Several machines as Markdown: one heading and one ```mermaid block (one diagram) each."""
    parts = []
    for name, machine in doc["machines"].items():
        parts.append(f"## {name}\n\n```mermaid\n{to_mermaid(machine)}```\n")
    return "\n".join(parts)
