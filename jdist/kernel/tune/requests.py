"""A running trial's requests from its ranks (``jdist.rank.tune.Trial``: ``suggest_*``, ``should_prune``,
``report``...), asked of its Optuna trial and answered on the ranks' control channel."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from jdist.protocol import TUNE_REPLY

if TYPE_CHECKING:
    from .driver import TrialRun

def answer(cluster: Any, tr: TrialRun, rank: int, msg: dict[str, Any]) -> None:
    """A trial's request from rank ``rank`` (``suggest``, ``should_prune``, ``report``, ``user_attr``,
    ``started``): asked of its Optuna trial, answered on the rank's control channel when it waits for one."""
    op, payload = msg["op"], msg["payload"]
    trial = tr.trial
    reply: dict[str, Any] = {"trial": msg["trial"], "seq": msg["seq"]}
    try:
        if op == "suggest":
            args = payload["args"]
            if payload["kind"] == "categorical":
                reply["value"] = trial.suggest_categorical(payload["name"], args["choices"])
            elif payload["kind"] == "int":
                reply["value"] = trial.suggest_int(payload["name"], args["low"], args["high"], step=args["step"],
                                                   log=args["log"])
            else:
                reply["value"] = trial.suggest_float(payload["name"], args["low"], args["high"], step=args["step"],
                                                     log=args["log"])
        elif op == "should_prune":  # decided once per call number: every rank of the slot agrees
            index = payload["index"]
            if index not in tr.decisions:
                tr.pruned = tr.pruned or bool(trial.should_prune())  # pruners may answer numpy.bool_
                tr.decisions[index] = tr.pruned
            reply["value"] = tr.decisions[index]
        elif op == "report":
            trial.report(payload["value"], payload["step"])
            return
        elif op == "user_attr":
            trial.set_user_attr(payload["key"], payload["value"])
            return
        elif op == "started":
            tr.started = time.time()
            return
    except Exception as exc:  # a bad suggestion (e.g. low > high): the rank raises it in the objective
        reply.pop("value", None)
        reply["error"] = f"{type(exc).__name__}: {exc}"
    if "value" in reply:
        reply["value"] = plain_value(reply["value"])
        try:
            json.dumps(reply["value"])
        except (TypeError, ValueError):
            reply = {"trial": reply["trial"], "seq": reply["seq"],
                     "error": f"{op}: the value {reply.pop('value')!r} cannot be sent to the ranks (not JSON)"}
    cluster.reply(rank, TUNE_REPLY, reply)


def plain_value(value: Any) -> Any:
    """numpy scalars (a categorical choice, a pruner's answer) as Python ones, for the JSON reply."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict, str)) else value


def as_request(distribution: Any) -> tuple[str, dict[str, Any]]:
    """An Optuna distribution as the ranks' ``suggest_*`` call names it: (kind, args).

    >>> import optuna
    >>> as_request(optuna.distributions.FloatDistribution(1e-4, 0.1, log=True))
    ('float', {'low': 0.0001, 'high': 0.1, 'step': None, 'log': True})
    >>> as_request(optuna.distributions.CategoricalDistribution(("adam", "sgd")))
    ('categorical', {'choices': ['adam', 'sgd']})
    """
    name = type(distribution).__name__
    if name == "CategoricalDistribution":
        return "categorical", {"choices": list(distribution.choices)}
    kind = "int" if name == "IntDistribution" else "float"
    return kind, {"low": distribution.low, "high": distribution.high, "step": distribution.step,
                  "log": distribution.log}
