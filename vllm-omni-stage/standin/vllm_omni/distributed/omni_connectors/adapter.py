"""Stand-in for vllm_omni/distributed/omni_connectors/adapter.py
(vllm-project/vllm-omni@0342827dd787296b8a6b1e9f523ebaa24d13c714):
``compute_talker_prompt_ids_length(prompt_ids)``, the Talker prompt's length
from the Thinker's prompt ids alone (Σ user turn lengths + 9 for the last
assistant turn, system turns skipped) — what the orchestrator's async-chunk
prewarm sizes the Talker's placeholder prompt with. The chat marker ids are
the toy vocabulary's (upstream: <|im_start|> 151644, system 8948, user 872,
assistant 77091)."""

from __future__ import annotations

from vllm_omni import _toy


def compute_talker_prompt_ids_length(prompt_ids: list[int]) -> int:
    starts = [i for i, t in enumerate(prompt_ids) if t == _toy.IM_START] + [len(prompt_ids)]
    total = 0
    for i in range(len(starts) - 1):
        s, e = starts[i], starts[i + 1]
        role = prompt_ids[s + 1] if s + 1 < len(prompt_ids) else None
        if role == _toy.SYSTEM:
            continue
        if role == _toy.USER:
            total += e - s
        elif role == _toy.ASSISTANT and i == len(starts) - 2:
            total += 9  # 3 + 4 + 1 + 1
    return total


_toy.drop_interfaces(globals(), __name__)
