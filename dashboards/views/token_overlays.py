"""A turn's tokens as HTML: one span per token, its text from the run's tokenizer, shaded by an overlay.

Environment tokens (the input the turn appended: prompt, tool output) are grey and italic;
model tokens carry the chosen overlay. Every span has a thin right edge, so token boundaries
stay visible in running text, and a tooltip with the token's id and figures.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

OVERLAYS = {
    "logprob": "Sampled logprob",
    "trainer_logprob": "Trainer logprob",
    "mismatch": "Train/infer mismatch",
    "entropy": "Entropy",
    "trainer_entropy": "Trainer entropy",
    "ratio": "Importance ratio",
    "loss_action": "Clipped / masked",
    "loss_mask": "Loss mask",
    "advantage": "Advantage",
}
"""The per-token overlays, in the order the selector offers them."""

LEGENDS = {
    "logprob": "Model tokens: red, deeper as the sampled token's probability falls.",
    "trainer_logprob": "Model tokens: red, deeper as the trainer's probability of the token falls.",
    "mismatch": "Model tokens: orange, deeper as |sampled logprob − trainer logprob| grows (1 nat: full).",
    "entropy": "Model tokens: purple, deeper as the sampling distribution's entropy grows (4 nats: full).",
    "trainer_entropy": "Model tokens: purple, deeper as the trainer's entropy at the token grows (4 nats: full).",
    "ratio": "Model tokens: teal, deeper as the importance ratio exp(trainer − sampled logprob) moves from 1 "
    "(a factor e: full).",
    "loss_action": "Model tokens: red where the loss zeroed the gradient (DPPO's mask, PPO's clip), amber where "
    "it only clipped or truncated the weight (GLM-5, TIS), clear where it kept the token.",
    "loss_mask": "Model tokens: blue when trained on (loss mask true), faded when masked out.",
    "advantage": "Trained model tokens: green for a positive advantage, red for a negative one, "
    "deeper as |advantage| nears the trajectory's largest.",
}

MAX_TOKENS_SHOWN = 4000
"""Tokens rendered per turn; the rest is summarised (a long turn would freeze the browser)."""

ENV_STYLE = "background:#eceff3;color:#6b7280;font-style:italic"
EDGE = "box-shadow:inset -1px 0 0 rgba(0,0,0,0.18)"


def model_values(turn: dict[str, Any], overlay: str, advantage: float | None) -> list[float | None] | None:
    """The overlay's figure per output token of `turn`, or None when the lake has none for it."""
    n = len(turn["output_token_ids"] or [])
    sampled = list(turn["output_logprobs"] or [])
    if overlay == "logprob":
        return sampled
    if overlay == "loss_mask":
        return [float(m) for m in loss_mask(turn)]
    if overlay == "advantage":
        return None if advantage is None else [advantage if m else None for m in loss_mask(turn)]
    if overlay == "mismatch":
        trainer = turn.get("trainer_logprob")
        if trainer is None:
            return None
        return [None if t is None or s is None else abs(s - t) for s, t in zip(sampled, trainer, strict=True)]
    recorded = turn.get(overlay)
    return None if recorded is None else list(recorded)[:n]


def loss_mask(turn: dict[str, Any]) -> list[bool]:
    """The turn's loss mask over its output (all true when the producer recorded none)."""
    mask = turn["loss_mask"]
    return [True] * len(turn["output_token_ids"] or []) if mask is None else [bool(m) for m in mask]


def background(overlay: str, value: float | None, scale: float = 1.0) -> str:
    """The CSS background of a model token with figure `value` under `overlay`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "transparent"
    if overlay == "ratio":
        return f"rgba(23,190,207,{0.85 * min(1.0, abs(math.log(max(value, 1e-9)))):.2f})"
    if overlay == "loss_action":
        return {2: "rgba(214,39,40,0.55)", 1: "rgba(255,187,51,0.6)"}.get(int(value), "transparent")
    if overlay in ("logprob", "trainer_logprob"):
        return f"rgba(214,39,40,{0.85 * (1 - math.exp(min(0.0, value))):.2f})"
    if overlay == "mismatch":
        return f"rgba(255,127,14,{0.85 * min(1.0, value):.2f})"
    if overlay in ("entropy", "trainer_entropy"):
        return f"rgba(148,103,189,{0.85 * min(1.0, value / 4):.2f})"
    if overlay == "loss_mask":
        return "rgba(31,119,180,0.28)" if value else "transparent"
    strength = 0.15 + 0.7 * min(1.0, abs(value) / scale) if scale else 0.15
    return f"rgba(44,160,44,{strength:.2f})" if value >= 0 else f"rgba(214,39,40,{strength:.2f})"


LOSS_ACTIONS = {0: "kept", 1: "clipped", 2: "masked"}
"""`loss_action` per token: what the loss did to it (`trainer_tokens.clipped` / `masked`)."""


def _at(values: Sequence[Any] | None, index: int) -> Any:
    return values[index] if values is not None and index < len(values) else None


def _tip(label: str, token: int, figures: dict[str, Any]) -> str:
    parts = [label, f"id {token}"]
    for name, value in figures.items():
        if value is not None:
            parts.append(f"{name} {value:.3f}" if isinstance(value, float) else f"{name} {value}")
    return html.escape(" · ".join(parts), quote=True)


def tokens_html(
    turn: dict[str, Any],
    texts: Sequence[str] | None,
    overlay: str,
    advantage: float | None = None,
    advantage_scale: float = 1.0,
) -> str:
    """One turn's appended input (environment) and sampled output (model, shaded by `overlay`).

    `texts` is each token's text from the tokenizer (input then output ids); without one, each
    token shows as `#id`."""
    inputs = list(turn["input_token_ids"] or [])
    outputs = list(turn["output_token_ids"] or [])
    ids = (inputs + outputs)[:MAX_TOKENS_SHOWN]
    shown = list(texts or [])[: len(ids)] if texts is not None else [f"#{i}" for i in ids]
    gap = "" if texts is not None else ";margin-right:3px"  # bare ids need a gap to stay readable
    values = model_values(turn, overlay, advantage) or []
    sampled = list(turn["output_logprobs"] or [])
    mask = loss_mask(turn)
    trainer = turn.get("trainer_logprob")
    spans = []
    for pos, (token, text) in enumerate(zip(ids, shown, strict=True)):
        if pos < len(inputs):
            tip = _tip("environment", token, {})
            spans.append(f'<span class="tok env" title="{tip}" style="{ENV_STYLE};{EDGE}{gap}">')
        else:
            at = pos - len(inputs)
            value = values[at] if at < len(values) else None
            figures = {
                "logprob": sampled[at] if at < len(sampled) else None,
                "trainer logprob": trainer[at] if trainer is not None and at < len(trainer) else None,
                "mask": int(mask[at]) if at < len(mask) else None,
                "advantage": advantage if overlay == "advantage" else None,
                "ratio": _at(turn.get("ratio"), at),
                "loss": LOSS_ACTIONS.get(_at(turn.get("loss_action"), at)),  # type: ignore[arg-type]
            }
            if (
                overlay not in ("logprob", "loss_mask", "advantage", "ratio", "loss_action")
                and value is not None
            ):
                figures[OVERLAYS[overlay].lower()] = value
            faded = ";opacity:0.55" if overlay == "loss_mask" and not value else ""
            style = f"background:{background(overlay, value, advantage_scale)};{EDGE}{faded}{gap}"
            spans.append(f'<span class="tok model" title="{_tip("model", token, figures)}" style="{style}">')
        spans.append(f"{html.escape(text)}</span>")
    hidden = len(inputs) + len(outputs) - len(ids)
    more = f"<em> … {hidden} more tokens</em>" if hidden > 0 else ""
    return (
        '<div style="font-family:monospace;white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.7">'
        + "".join(spans)
        + more
        + "</div>"
    )
