"""Named engine metrics, readable through `llm.get_metrics()` and exported as Prometheus text.

Counters are plain integers owned by the engine; `Metric` is the read-only snapshot handed out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

PREFIX = "tandem:"


@dataclass(frozen=True)
class Metric:
    name: str
    value: Union[int, float]
    labels: dict[str, str] = field(default_factory=dict)
    kind: str = "counter"  # "counter" | "gauge"


@dataclass(frozen=True)
class Vector:
    """A counter with one value per position (vLLM's per-position accepted tokens)."""
    name: str
    values: list[int]
    label: str = "position"
    kind: str = "counter"


def to_prometheus(metrics: list[Union[Metric, Vector]], model_name: str) -> str:
    """Prometheus text exposition; counters get the conventional `_total` suffix."""
    lines: list[str] = []
    for m in metrics:
        prom = m.name  # colons are legal in Prometheus metric names
        suffix = "_total" if m.kind == "counter" else ""
        lines.append(f"# TYPE {prom}{suffix} {m.kind}")
        if isinstance(m, Vector):
            for i, v in enumerate(m.values):
                lines.append(f'{prom}{suffix}{{model_name="{model_name}",{m.label}="{i}"}} {v}')
        else:
            labels = {"model_name": model_name, **m.labels}
            label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{prom}{suffix}{{{label_text}}} {m.value}")
    return "\n".join(lines) + "\n"
