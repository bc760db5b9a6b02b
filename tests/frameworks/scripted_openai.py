"""An Agents SDK ``Model`` that returns scripted tool calls: a function of its input, so a run resumed in
another process gets the same answers (first a call to ``execute`` with the program, then, once the
call's output is in, a message quoting it)."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from agents import Model, ModelResponse, Usage
from agents.testing import assistant_message, function_call


class ScriptedAgentModel(Model):
    def __init__(self, program: str, call_id: str = "call-1") -> None:
        self.program, self.call_id = program, call_id

    async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any, tools: list[Any],
                           output_schema: Any, handoffs: list[Any], tracing: Any, **kwargs: Any) -> ModelResponse:
        items = input if isinstance(input, list) else []
        outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if outputs:
            out = assistant_message(json.dumps({"saw": outputs[-1].get("output")}))
        else:
            assert [t.name for t in tools] == ["execute"], tools
            out = function_call("execute", {"code": self.program, "key": None}, call_id=self.call_id)
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model answers whole responses only")
