"""The tool loop, once for every API and stream mode: plan -> turn -> decide -> run. Each wire API's
own parts are its adapter's (gateway.apis)."""

from gateway.engine.events import (
    Event,
    Finished,
    Keepalive,
    Opened,
    ToolRun,
    ToolsRan,
    ToolsStarted,
    Visible,
)
from gateway.engine.plan import Plan, Wire
from gateway.engine.run import Engine
from gateway.engine.turn import ModelCall, ModelTurn

__all__ = ["Engine", "Event", "Finished", "Keepalive", "ModelCall", "ModelTurn", "Opened", "Plan", "ToolRun",
           "ToolsRan", "ToolsStarted", "Visible", "Wire"]
