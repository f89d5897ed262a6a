"""Decide each round what to write: the merge patch of our annotations, or nothing (DESIGN §6).

Pure: given the topology annotation text, this round's observation and what the node carries, it returns
the patch. Nothing is written when nothing changed, except the heartbeat: the state is re-written with a
fresh `observed` once `heartbeat` seconds have passed since the last write, so the extender can tell a live
reporter from a dead one.

`generation` counts changes of the state's content (`used`, `unhealthy`, `pods`): a heartbeat keeps it, a change
adds one. It continues from what the node already carries, so it keeps growing across reporter restarts.

An unknown state (pod-resources unreachable, device ids that name no GPU) removes the `state` annotation
(a merge patch with null). The extender treats a node without a state as unknown at once, so it stops
placing pods by occupancy the reporter cannot vouch for, rather than trusting a stale `used` until the
staleness bound runs out; the topology stays. The next known state is written as a change (generation + 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from topology.agent.devices import Observation, Unknown
from topology.annotations import AnnotationKeys
from topology.codec import STATE_MAX_BYTES, CodecError, NodeState, decode_state, encode_state


@dataclass(frozen=True, slots=True)
class NodeAnnotations:
    """Our annotations as the node carries them, as far as the reporter knows (from a GET or a patch's answer)."""

    topology: str | None = None
    state_text: str | None = None
    state: NodeState | None = None  # `state_text` decoded; None when absent or unreadable
    generation: int = 0  # the highest generation seen on the node or written
    written: float | None = None  # monotonic time this process last wrote the state

    @classmethod
    def read(cls, annotations: Mapping[str, str] | None, keys: AnnotationKeys, *, generation: int = 0,
             written: float | None = None) -> NodeAnnotations:
        annotations = annotations or {}
        state_text = annotations.get(keys.state)
        state = None
        if state_text is not None:
            try:
                state = decode_state(state_text)
            except CodecError:
                state = None  # rewritten by the next known state, removed by an unknown one
        return cls(annotations.get(keys.topology), state_text, state,
                   max(generation, state.generation if state else 0), written)


@dataclass(frozen=True, slots=True)
class Plan:
    patch: dict[str, str | None] = field(default_factory=dict)  # annotation -> value, None deletes; {}: no write
    why: tuple[str, ...] = ()
    state: NodeState | None = None  # the state the patch writes, if it writes one
    refused: str | None = None  # an annotation over its size budget, refused

    @property
    def writes(self) -> bool:
        return bool(self.patch)


def plan(keys: AnnotationKeys, topology: str, observation: Observation | Unknown, node: NodeAnnotations,
         now: float, heartbeat: float, observed: datetime) -> Plan:
    """The patch for this round. `now` is monotonic seconds; `observed` is when pod-resources was read."""
    patch: dict[str, str | None] = {}
    why: list[str] = []
    if node.topology != topology:
        patch[keys.topology] = topology
        why.append("topology " + ("published" if node.topology is None else "changed"))
    refused = None
    if isinstance(observation, Observation):
        state, text, reason = _state(observation, node, now, heartbeat, observed)
        if text is not None and len(text.encode()) > STATE_MAX_BYTES:
            refused = (f"state annotation would be {len(text.encode())} bytes, over its {STATE_MAX_BYTES}-byte "
                       "budget; refusing to write it, the state is unknown")
            observation = Unknown(refused)
        elif text is not None:
            patch[keys.state] = text
            why.append(reason)
            return Plan(patch, tuple(why), state)
        else:
            return Plan(patch, tuple(why))
    if node.state_text is not None:
        patch[keys.state] = None
        why.append(f"state unknown: {observation.reason}")
    return Plan(patch, tuple(why), refused=refused)


def _state(observation: Observation, node: NodeAnnotations, now: float, heartbeat: float,
           observed: datetime) -> tuple[NodeState | None, str | None, str]:
    """The state to write and why, or (None, None, "") when the node's state is current and no heartbeat is due."""
    previous = node.state
    changed = (previous is None or previous.used != observation.used or previous.unhealthy != observation.unhealthy
               or previous.pods != observation.pods or previous.sharing != observation.sharing)
    if changed:
        reason = "state published" if previous is None else "state changed"
        generation = node.generation + 1
    elif node.written is None or now - node.written >= heartbeat:
        reason = "heartbeat"
        generation = previous.generation
    else:
        return None, None, ""
    state = NodeState(observation.used, observation.unhealthy, observed, generation, observation.pods,
                      observation.sharing)
    return state, encode_state(state), reason
