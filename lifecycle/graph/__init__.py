"""The machines' state graphs under a config, for review (the library behind ``lifecycle graph``).

Everything is derived from the specs in :mod:`lifecycle.decide.machines` compiled for one config
(:meth:`MachineSpec.compile`), so a graph cannot disagree with what runs. One JSON-ready model
(schema ``rl-lifecycle/graph@1``, documented in ``docs/graphs/SCHEMA.md``) is built first; the
mermaid, DOT, SVG/PNG (graphviz ``dot``) and HTML outputs are renderings of it.

Notation, the same in every rendering:

* edge label ``trigger [guards] / effects``; a guard shows its predicate's value under the
  config: ``recover [rollout_ft=true]``, ``fail [!rollout_ft (rollout_ft=true)]``;
* an edge whose guard is false is *inactive*: dashed grey in DOT/SVG/PNG, prefixed ``✗`` in
  mermaid (mermaid's stateDiagram cannot style a single edge), dropped with ``--prune``;
* a gated effect whose predicate is false is left out of the label (it does not happen under
  this config); the JSON keeps it with ``"active": false`` and the HTML page strikes it through;
* terminal states get a double border (DOT) or a ``--> [*]`` arrow (mermaid); marked states
  (``StateSpec.marked``) are red; states unreachable from ``Init`` under the config are grey.

Ordering follows the spec (states and transitions as written, a transition's sources in order),
so a spec change produces a diff at the place it was made.
"""

from __future__ import annotations

from lifecycle.graph.compare import diff_machines, reference_config
from lifecycle.graph.dot import config_label, render, render_svgs, require_dot, to_dot
from lifecycle.graph.golden import GOLDEN_HEADER, check_golden, golden_files, write_golden
from lifecycle.graph.markup import markup_machine, to_markup
from lifecycle.graph.mermaid import to_mermaid, to_mermaid_markdown
from lifecycle.graph.model import (
    INACTIVE_MARK,
    SCHEMA,
    GraphJSON,
    MachineJSON,
    edge_ids_guarded_by,
    edge_label,
    graph_document,
    load_json,
    machine_graph,
    to_json,
)
from lifecycle.graph.review import build_review

FORMATS = ("mermaid", "dot", "json", "svg", "png", "html")

__all__ = [
    "FORMATS",
    "GOLDEN_HEADER",
    "INACTIVE_MARK",
    "SCHEMA",
    "GraphJSON",
    "MachineJSON",
    "build_review",
    "check_golden",
    "config_label",
    "diff_machines",
    "edge_ids_guarded_by",
    "edge_label",
    "golden_files",
    "graph_document",
    "load_json",
    "machine_graph",
    "markup_machine",
    "reference_config",
    "render",
    "render_svgs",
    "require_dot",
    "to_dot",
    "to_json",
    "to_markup",
    "to_mermaid",
    "to_mermaid_markdown",
    "write_golden",
]
