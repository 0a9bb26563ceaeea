"""An NPC that follows, trades and attacks: actions (protocol 1.3 tools) from a headless "game".

    python samples/npc_actions.py [--endpoint tcp://127.0.0.1:5599] [--json turns.json]

Brom the blacksmith may call three actions, declared with every line the player says:
``follow {distance}``, ``trade {item, price}`` and ``attack {target}``. The sidecar holds each
call to a declared action with arguments valid against its schema (whatever the model), the
game does what the call says to its own state (Brom's position, the player's gold, the wolf's
health), answers with what came of it (``tool_results``), and Brom's reply continues from
that. Without ``--endpoint`` the sample starts a sidecar with the default model and stops it
at the end; with one it uses that sidecar (any model).

Each player line asks for an action the way a game would: ``required`` (Brom must act, any of
the three), then a named action (``trade``: exactly that one), then ``auto`` (talk or act, as
the model likes). The reply after the results is text only (``tool_choice: none``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from igi_sdk.client import Client, ToolCall

TOOLS: list[dict[str, Any]] = [
    {"name": "follow", "description": "Follow the player, keeping a distance in metres.",
     "parameters": {"type": "object", "additionalProperties": False, "required": ["distance"],
                    "properties": {"distance": {"type": "integer", "minimum": 1, "maximum": 10}}}},
    {"name": "trade", "description": "Offer the player an item for a price in gold coins.",
     "parameters": {"type": "object", "additionalProperties": False, "required": ["item", "price"],
                    "properties": {"item": {"type": "string", "maxLength": 40},
                                   "price": {"type": "integer", "minimum": 1, "maximum": 500}}}},
    {"name": "attack", "description": "Attack a target.",
     "parameters": {"type": "object", "additionalProperties": False, "required": ["target"],
                    "properties": {"target": {"type": "string",
                                              "enum": ["wolf", "bandit", "player"]}}}},
]
NAMES = {t["name"] for t in TOOLS}

# (what the player says, tool_choice)
SCRIPT: list[tuple[str, str]] = [
    ("Brom, follow me to the mill.", "required"),
    ("I need a sword. What will it cost me?", "trade"),
    ("A wolf! It is right behind you!", "auto"),
]


class World:
    """The game's own state, changed only by the actions it chooses to carry out."""

    def __init__(self) -> None:
        self.gold = 120
        self.inventory: list[str] = []
        self.following_at: int | None = None
        self.wolf_health = 10

    def carry_out(self, call: ToolCall) -> str:
        """Does what the call asks and says what came of it (the tool result)."""
        args = call.args()
        if call.name == "follow":
            self.following_at = int(args["distance"])
            return f"Brom now follows the player {self.following_at} m behind."
        if call.name == "trade":
            item, price = str(args["item"]), int(args["price"])
            if price > self.gold:
                return f"The player cannot pay {price} gold for the {item}: they have {self.gold}."
            self.gold -= price
            self.inventory.append(item)
            return f"The player paid {price} gold for the {item}; {self.gold} gold left."
        if call.name == "attack":
            if args["target"] != "wolf":
                return f"Brom refuses to attack the {args['target']}."
            self.wolf_health -= 6
            fled = self.wolf_health <= 4
            return "Brom hits the wolf; it flees." if fled else "Brom hits the wolf."
        return f"Nothing happens ({call.name} is not an action of this game)."


def play(endpoint: str, timeout: float) -> list[dict[str, Any]]:
    client = Client(endpoint, timeout=timeout, engine="npc-actions-sample", game_pid=os.getpid())
    try:
        client.wait_ready(timeout)
        session = client.open_session(
            "You are Brom, the blacksmith of Oakvale in a fantasy game. You can follow the player, "
            "trade your wares and attack threats. Answer in one short sentence.",
            sampling={"temperature": 0, "seed": 1})
        world, turns = World(), []
        for line, choice in SCRIPT:
            print(f"\nplayer: {line}   (tool_choice {choice})")
            t0 = time.monotonic()
            stream = client.chat(session, line, tools=TOOLS, tool_choice=choice, max_tokens=96)
            said = "".join(e for e in stream.events() if isinstance(e, str))
            calls = stream.tool_calls
            done = stream.done or {}
            turn: dict[str, Any] = {"line": line, "choice": choice, "said": said,
                                    "finish_reason": done.get("finish_reason"), "calls": [],
                                    "reply": None, "call_s": round(time.monotonic() - t0, 2)}
            if said:
                print(f"Brom: {said}")
            results = []
            for call in calls:
                outcome = world.carry_out(call)
                print(f"  Brom does {call.name}{call.arguments} -> {outcome}")
                turn["calls"].append({"id": call.id, "name": call.name,
                                      "arguments": call.args(), "result": outcome})
                results.append({"id": call.id, "content": outcome})
            if results:
                # the reply continues from what came of the calls (only words this time)
                t1 = time.monotonic()
                after = client.chat(session, "", tools=TOOLS, tool_choice="none",
                                    tool_results=results, max_tokens=40)
                turn["reply"] = after.result()["text"]
                turn["reply_s"] = round(time.monotonic() - t1, 2)
                print(f"Brom: {turn['reply']}")
            turns.append(turn)
        print(f"\nthe world: gold {world.gold}, inventory {world.inventory}, "
              f"Brom follows at {world.following_at} m, wolf health {world.wolf_health}")
        return turns
    finally:
        client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--endpoint",
                    help="a running sidecar (default: start one with the default model)")
    ap.add_argument("--json", help="write the turns here")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds to wait for the sidecar to be ready")
    args = ap.parse_args()
    if args.endpoint:
        turns = play(args.endpoint, args.timeout)
    else:
        with tempfile.TemporaryDirectory(prefix="igi-actions-") as tmp:
            endpoint = f"ipc://{Path(tmp) / 'sidecar.sock'}"
            cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint,
                   "--ctx", "2048", "--save-dir", str(Path(tmp) / "saves"),
                   "--game-pid", str(os.getpid())]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=env)
            try:
                turns = play(endpoint, args.timeout)
            finally:
                proc.terminate()
                proc.wait(10)
    if args.json:
        Path(args.json).write_text(json.dumps(turns, indent=1))
    bad = [c for t in turns for c in t["calls"] if c["name"] not in NAMES]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
