"""The tool loop, once for every API and stream mode: plan -> turn -> decide -> run."""

from gateway.engine.plan import Plan, plan_chat, plan_responses
from gateway.engine.run import Engine, Event, Finished, Keepalive, Opened, Visible
from gateway.engine.turn import ModelCall, ModelTurn

__all__ = ["Engine", "Event", "Finished", "Keepalive", "ModelCall", "ModelTurn", "Opened", "Plan", "Visible",
           "plan_chat", "plan_responses"]
